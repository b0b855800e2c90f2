"""Column lists and row filters: the options, the checks of a selection and of a filter's text, and
the publication's table list they make. No services."""

from __future__ import annotations

import pytest

from cdc_worker.config import ConfigError, config_from_values, resolve_values
from cdc_worker.core.model import Column, ReplicaIdentity, TableSchema
from cdc_worker.shell.postgres.catalog import CatalogTable
from cdc_worker.shell.postgres.subsets import (
    Published,
    Selection,
    changed,
    columns_used,
    filter_text_problem,
    select,
    table_spec,
)
from cdc_worker.shell.snapshot.chunks import Chunk

DSN = "postgresql://u@h/db"


def _users(identity: ReplicaIdentity = ReplicaIdentity.DEFAULT) -> CatalogTable:
    full = identity is ReplicaIdentity.FULL
    columns = (
        Column("id", 23, -1, True),
        Column("region", 25, -1, full),
        Column("email", 25, -1, full),
        Column("password_hash", 25, -1, full),
    )
    return CatalogTable(TableSchema(5, "shop", "users", columns, identity, ("id",)), True, True, True, 1, 1)


def test_per_table_options_from_flags_and_the_environment() -> None:
    given = {"postgres": DSN, "columns": ["shop.users=id, email", "orders=id"]}
    config = config_from_values(resolve_values(given, {}))
    assert config.columns == (("shop.users", "id, email"), ("orders", "id"))
    env = {"BOTTLEDWATER_ROW_FILTER": "shop.orders=region = 'eu' AND total > 0;shop.users=id < 10"}
    config = config_from_values(resolve_values({"postgres": DSN}, env))
    assert config.row_filter == (("shop.orders", "region = 'eu' AND total > 0"), ("shop.users", "id < 10"))
    with pytest.raises(ConfigError, match="--exclude-columns: 'users' is not GLOB=VALUE"):
        resolve_values({"postgres": DSN, "exclude_columns": ["users"]}, {})


def test_a_selection_keeps_the_columns_and_rows_asked_for() -> None:
    selection = Selection(
        exclude_columns=(("shop.*", "password_hash"),),
        row_filters=(("users", "id > 100"), ("users", "id > 7")),
    )
    table, problems = select(_users(), selection)
    assert problems == []
    assert [c.name for c in table.schema.columns] == ["id", "region", "email"]
    assert table.column_list == ("id", "region", "email") and table.row_filter == "id > 7", (
        "the last match wins"
    )
    spec = repr(table_spec(table))
    assert "Identifier('id'), SQL(', '), Identifier('region')" in spec and "SQL('id > 7')" in spec
    copy = repr(Chunk(table).copy_statement())
    assert "SQL(' WHERE '), Composed([Composed([SQL('('), SQL('id > 7'), SQL(')')" in copy, "the same rows"
    whole, _ = select(_users(), Selection(columns=(("other.*", "id"),)))
    assert whole.column_list is None and whole.row_filter is None, "a glob matching nothing changes nothing"


def test_key_and_replica_identity_columns_cannot_be_left_out() -> None:
    _, problems = select(_users(), Selection(columns=(("users", "email"),)))
    assert problems == [
        "column id of shop.users is in its key or replica identity and cannot be left out of the "
        "publication: keep it in --columns / remove it from --exclude-columns"
    ]
    _, problems = select(_users(ReplicaIdentity.FULL), Selection(exclude_columns=(("users", "email"),)))
    assert len(problems) == 1 and "column email of shop.users" in problems[0]
    _, problems = select(_users(), Selection(columns=(("users", "id,nope"),)))
    assert problems == [
        "--columns: table shop.users has no column nope (its columns: id, region, email, password_hash)"
    ]


def test_a_row_filter_may_use_replica_identity_columns_only() -> None:
    _, problems = select(_users(), Selection(row_filters=(("users", "region = 'eu' AND id > 1"),)))
    assert len(problems) == 1 and "uses column region, which is not in its replica identity" in problems[0]
    _, problems = select(_users(ReplicaIdentity.FULL), Selection(row_filters=(("users", "region = 'eu'"),)))
    assert problems == []
    assert columns_used("\"Region\" = 'id' AND id > 1", ["id", "Region"]) == ["Region", "id"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("id > 1; DROP TABLE users", "';'"),
        ("id > 1 -- x", "'--'"),
        ("id > 1 /* x */", "'/*'"),
        ("id = $$1$$", "'$'"),
        ("id > 1) OR (true", "unbalanced parentheses"),
        ("(id > 1", "unbalanced parentheses"),
        ("region = 'eu", "unbalanced quotes"),
    ],
)
def test_a_row_filter_is_one_expression(text: str, says: str) -> None:
    problem = filter_text_problem(text, "--row-filter for shop.users")
    assert problem is not None and says in problem and "\n" not in problem


def test_quoted_text_may_hold_anything() -> None:
    assert filter_text_problem("note = 'a;b -- (c' AND \"we;ird\" > 1", "x") is None


def test_a_resumed_slot_keeps_its_selection() -> None:
    table, _ = select(
        _users(), Selection(exclude_columns=(("users", "password_hash"),), row_filters=(("users", "id > 7"),))
    )
    oid = table.schema.oid
    held = {oid: Published(("id", "region", "email"), "(id > 7)")}
    assert changed([table], {oid: "(id > 7)"}, held, "s1") == []
    (refused,) = changed([table], {oid: "(id > 8)"}, held, "s1")
    assert (
        refused.startswith("the row filter of shop.users differs")
        and "bottledwater slot drop -s s1" in refused
    )
    (refused,) = changed([_users()], {}, held, "s1")
    assert refused.startswith("the column list of shop.users differs")
    assert changed([table], None, held, "s1") == [], (
        "on a standby the filters cannot be printed: columns only"
    )
    assert changed([table], {oid: "(id > 7)"}, {}, "s1") == [], "a table joining the publication"
