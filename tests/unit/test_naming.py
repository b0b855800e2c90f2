"""Bottled Water's safe names, topic names and Avro names."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_worker.core.model import Column, TableSchema
from cdc_worker.core.pgtypes.oids import PgType
from kafka_contract.avro_names import (
    AVRO_NAMESPACE_PREFIX,
    avro_field_names,
    avro_namespace,
    avro_record_name,
)
from kafka_contract.topics import (
    MAX_TOPIC_NAME_LENGTH,
    NamingError,
    control_topic_name,
    safe_name,
    topic_name,
)

AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
KAFKA_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
ESCAPE = re.compile(r"_([0-9a-f]{2})_")


def table(namespace: str, name: str, *columns: str) -> TableSchema:
    return TableSchema(1, namespace, name, tuple(Column(c, PgType.TEXT, -1) for c in columns or ("id",)))


def unescape(safe: str) -> bytes:
    """Decode a safe name whose source held no `_xx_`-looking run (true for the generated inputs)."""
    return ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), safe).encode("latin-1")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("person.name/surname", "person_2e_name_2f_surname"),
        ("crêpes", "cr_c3__aa_pes"),
        ("plain_Name_42", "plain_Name_42"),
        ("1st", "_31_st"),
        ("a1", "a1"),
        ("with space", "with_20_space"),
    ],
)
def test_safe_name_escapes_like_bottled_water(name: str, expected: str) -> None:
    assert safe_name(name) == expected


@given(st.text(min_size=1, max_size=63).filter(lambda s: "_" not in s))
def test_safe_name_is_a_valid_avro_name_that_decodes_back(name: str) -> None:
    safe = safe_name(name)
    assert AVRO_NAME.fullmatch(safe)
    assert unescape(safe) == name.encode("utf-8")


def test_safe_name_refuses_empty() -> None:
    with pytest.raises(NamingError):
        safe_name("")


def test_topic_name_leaves_out_public_and_keeps_other_schemas() -> None:
    assert topic_name(table("public", "users")) == "users"
    assert topic_name(table("sales", "order items")) == "sales.order_20_items"
    assert topic_name(table("public", "users"), "prod-db") == "prod-db.users"
    assert topic_name(table("my.schema", "t"), "p") == "p.my_2e_schema.t"


def test_control_topic_name() -> None:
    assert control_topic_name() == "bottledwater.control"
    assert control_topic_name("prod") == "prod.bottledwater.control"


def test_topic_name_refuses_the_control_topic() -> None:
    with pytest.raises(NamingError, match="control topic"):
        topic_name(table("bottledwater", "control"))


def test_topic_name_refuses_illegal_prefix() -> None:
    with pytest.raises(NamingError, match="prefix"):
        topic_name(table("public", "t"), "bad/prefix")


def test_topic_name_of_63_character_names_fits_unless_escaping_blows_it_up() -> None:
    long_ascii = "x" * 63
    topic = topic_name(table(long_ascii, long_ascii), "prefix")
    assert KAFKA_TOPIC.fullmatch(topic)
    all_escaped = "é" * 31  # 62 bytes, each escaped to 4 characters
    with pytest.raises(NamingError, match=str(MAX_TOPIC_NAME_LENGTH)):
        topic_name(table(all_escaped, all_escaped))


def test_avro_record_name_and_namespace() -> None:
    t = table("Sales Dept", "crêpes")
    assert avro_record_name(t) == "cr_c3__aa_pes"
    assert avro_namespace(t) == f"{AVRO_NAMESPACE_PREFIX}.Sales_20_Dept"
    assert avro_namespace(table("public", "t")) == f"{AVRO_NAMESPACE_PREFIX}.public"


def test_avro_field_names_refuse_columns_that_escape_alike() -> None:
    t = table("public", "t", "a.b", "a_2e_b")
    with pytest.raises(NamingError, match="rename"):
        avro_field_names(t, ["a.b", "a_2e_b"])
    assert avro_field_names(t, ["a.b", "c"]) == ["a_2e_b", "c"]
