"""The type catalog: one table per type family, each value paired with what Postgres says it is.

Like Debezium's `postgres_create_tables.ddl`, with one twist: expected values are not written out
by hand but computed by Postgres itself from the stored value, through an SQL expression per column
(`extract(epoch …)` for microseconds, `c - date '1970-01-01'` for days, `hstore_to_json`, psycopg2's
own Decimal and list parsing, the ISO-8601 interval style, …). `{c}` stands for the column.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cdc_worker.core.pgtypes.temporal import (
    DATE_NEG_INFINITY,
    DATE_POS_INFINITY,
    TIMESTAMP_NEG_INFINITY,
    TIMESTAMP_POS_INFINITY,
)

SETUP = (
    "CREATE EXTENSION hstore",
    "CREATE EXTENSION citext",
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE DOMAIN price AS numeric(8,2) CHECK (VALUE >= 0)",
    "CREATE DOMAIN short_text AS varchar(10)",
    "CREATE TYPE pair AS (a int, b text)",
    'CREATE SCHEMA "Sales Dept"',
    # ISO-8601 years as the JSON contract writes them: astronomical (1 BC is 0000), signed when
    # before year 0 or past 9999. Postgres's extract(year) counts 1 BC as -1.
    """CREATE FUNCTION bw_iso_year(y int) RETURNS text LANGUAGE sql IMMUTABLE AS $$
         SELECT CASE WHEN a < 0 THEN '-' || lpad((-a)::text, 4, '0')
                     WHEN a > 9999 THEN '+' || a::text
                     ELSE lpad(a::text, 4, '0') END
           FROM (SELECT CASE WHEN y < 0 THEN y + 1 ELSE y END AS a) AS astronomical $$""",
)

SAME = "{c}"
TEXT = "{c}::text"
TO_JSON = "to_json({c})"
MICROS = "(extract(epoch from {c}) * 1000000)::numeric(40, 0)"


def _sentinels(expr: str, positive: int, negative: int) -> str:
    return (
        f"CASE WHEN {{c}} = 'infinity' THEN {positive} WHEN {{c}} = '-infinity' THEN {negative} "
        f"ELSE {expr} END"
    )


def _iso(value: str, pattern: str, suffix: str = "") -> str:
    iso = f"bw_iso_year(extract(year from {value})::int) || to_char({value}, '{pattern}'){suffix}"
    return f"CASE WHEN isfinite({{c}}) THEN {iso} ELSE {{c}}::text END"


@dataclass(frozen=True)
class CatalogColumn:
    """A column, its rows' SQL literals, and the SQL for its expected Avro and JSON values."""

    name: str
    sql_type: str
    values: tuple[str, ...]
    avro: str = SAME
    json: str = SAME
    # A conversion of the expected Avro value that SQL cannot express (see `EXPECTED_TRANSFORMS`).
    transform: str = ""
    # Decode the Avro value with logical types; False reads the raw int/long (sentinels, BC dates).
    logical: bool = True


@dataclass(frozen=True)
class CatalogTable:
    name: str
    columns: tuple[CatalogColumn, ...]
    schema: str = "public"
    rows: int = field(init=False)

    def __post_init__(self) -> None:
        counts = {len(c.values) for c in self.columns}
        if len(counts) != 1:
            raise ValueError(f"columns of {self.name} have different row counts {counts}")
        object.__setattr__(self, "rows", counts.pop())


def col(name: str, sql_type: str, *values: str, **expect: str | bool) -> CatalogColumn:
    return CatalogColumn(name, sql_type, values, **expect)  # type: ignore[arg-type]


DAYS = _sentinels("{c} - date '1970-01-01'", DATE_POS_INFINITY, DATE_NEG_INFINITY)
STAMP = _sentinels(MICROS, TIMESTAMP_POS_INFINITY, TIMESTAMP_NEG_INFINITY)
INTERVAL_RECORD = (
    "CASE WHEN {c} IS NOT NULL THEN json_build_object("
    "'months', (extract(year from {c}) * 12 + extract(month from {c}))::int, "
    "'days', extract(day from {c})::int, "
    "'micros', (extract(hour from {c}) * 3600000000 + extract(minute from {c}) * 60000000"
    " + extract(microseconds from {c}))::bigint) END"
)
UTC_STAMPS_JSON = (
    "(SELECT json_agg(to_char(x AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') ORDER BY n) "
    "FROM unnest({c}) WITH ORDINALITY AS u(x, n))"
)
N = "NULL"
DOCUMENTS = ('\'{"a": [1, 2.50, null], "é": "x"}\'', "'12345678901234567890.123'", "'\"s\"'", "'null'", N)

CATALOG = (
    CatalogTable("integers", (
        col("i2", "smallint", "-32768", "32767", "0", N, json=TO_JSON),
        col("i4", "integer", "-2147483648", "2147483647", "8192", N, json=TO_JSON),
        col("i8", "bigint", "-9223372036854775808", "9223372036854775807", "-1", N, json=TO_JSON),
        col("o", "oid", "0", "4294967295", "16384", N, avro="{c}::bigint", json="to_json({c}::bigint)"),
        col("b", "boolean", "true", "false", N, "true", json=TO_JSON),
    )),
    CatalogTable("numerics", (
        col("n10_2", "numeric(10,2)", "-12345678.9", "0", "0.01", N, json=TEXT),
        col("n5", "numeric(5)", "-99999", "99999", "0", N, json=TEXT),
        col("n4_neg2", "numeric(4,-2)", "999900", "-1234", "0", N, json=TEXT),
        col("n3_5", "numeric(3,5)", "0.00999", "-0.00001", "0", N, json=TEXT),
        col("free", "numeric", "3.14159265358979323846264338327950288419716939937510", "'NaN'", "-1e-30", N,
            avro=TEXT, json=TEXT),
        col("m", "money", "1234.56", "-92233720368547758.08", "0", N,
            avro="{c}::numeric", json="({c}::numeric)::text"),
    )),
    CatalogTable("floats", (
        col("f4", "real", "1.1", "'-0'", "'3.4028235e+38'", "'NaN'", "'Infinity'", "'-Infinity'",
            "'1e-45'", N, avro="{c}::float8", json=TO_JSON),
        col("f8", "double precision", "0.1", "'-1.7976931348623157e+308'", "'5e-324'", "'NaN'", "'Infinity'",
            "'-Infinity'", "-0.0", N, json=TO_JSON),
    )),
    CatalogTable("strings", (
        col("t", "text", "'Zoë 👩‍🔬 \"q\" \\ back'", "E'tab\\tnew\\nline'", "''", N),
        col("vc", "varchar(20)", "'crêpes'", "'x'", "''", N),
        col("bp", "char(5)", "'ab'", "'ünï'", "''", N),
        col("nm", "name", "'a name'", "'ñ'", "''", N),
        col("ch", '"char"', "'a'", "'Z'", "''", N),
        col("ci", "citext", "'MiXeD Ünï'", "'x'", "''", N, avro=TEXT, json=TEXT),
    )),
    CatalogTable("binary", (
        col("b", "bytea", "'\\x00ff00'::bytea", "''::bytea", "decode(repeat('00ff', 3000), 'hex')", N,
            transform="bytes", json="replace(encode({c}, 'base64'), E'\\n', '')"),
        col("u", "uuid", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "gen_random_uuid()",
            "'00000000-0000-0000-0000-000000000000'", N, avro=TEXT, transform="uuid", json=TEXT),
    )),
    CatalogTable("documents", (
        col("j", "json", *DOCUMENTS, avro=TEXT),
        col("jb", "jsonb", *DOCUMENTS, avro=TEXT),
    )),
    CatalogTable("temporal", (
        col("d", "date", "'2024-02-29'", "'0044-03-15 BC'", "'10000-01-01'", "'infinity'", "'-infinity'", N,
            avro=DAYS, json=_iso("{c}", "-MM-DD"), logical=False),
        col("ts", "timestamp", "'2024-01-02 03:04:05.123456'", "'0044-03-15 12:00 BC'", "'1900-01-01 00:00'",
            "'infinity'", "'-infinity'", N, avro=STAMP, transform="int", logical=False,
            json=_iso("{c}", '-MM-DD"T"HH24:MI:SS.US')),
        col("tz", "timestamptz", "'2024-01-02 03:04:05.5+05:30'", "'1800-01-01 00:00:00 Europe/Amsterdam'",
            "'2024-06-01 12:00 America/St_Johns'", "'infinity'", "'-infinity'", "'0001-01-01 00:00:00+00 BC'",
            avro=STAMP, transform="int", logical=False,
            json=_iso("({c} AT TIME ZONE 'UTC')", '-MM-DD"T"HH24:MI:SS.US', " || 'Z'")),
        col("t", "time", "'04:05:06.789'", "'24:00:00'", "'00:00:00'", "'23:59:59.999999'", N, "'12:00'",
            avro="(extract(epoch from {c}) * 1000000)::bigint", logical=False,
            json="to_char({c}::interval, 'HH24:MI:SS.US')"),
        col("ttz", "timetz", "'04:05:06.5+05:30'", "'23:00-08'", "'00:00:00+00'", N, N,
            "'12:00:00.000001-03:30'", avro=TEXT, json=TEXT),
        col("iv", "interval", "'1 year 2 mons -3 days 04:05:06.5'", "'-1 years -2 mons +3 days -04:05:06.5'",
            "'0'", "'25:00:00'", "'-0.000001 s'", N,
            avro=INTERVAL_RECORD, json="{c}::text /* iso_8601 session */"),
    )),
    CatalogTable("arrays", (
        col("ai", "int4[]", "'{1,NULL,3}'", "'{}'", "ARRAY[NULL]::int4[]", N, json=TO_JSON),
        col("at", "text[]", "ARRAY['a b', 'NULL', NULL, 'x\"y\\z', '', '{br}', 'a,b', 'é']", "'{}'",
            "'{NULL}'", N, json=TO_JSON),
        col("an", "numeric(6,2)[]", "'{1.5,NULL,-2}'", "'{}'", "'{0}'", N, json="to_json({c}::text[])"),
        col("ats", "timestamptz[]", "'{\"2024-01-02 03:04:05.5+00\",NULL}'",
            "ARRAY['1999-12-31 23:00-05']::timestamptz[]", "ARRAY[NULL]::timestamptz[]", N,
            json=UTC_STAMPS_JSON),
        col("ab", "box[]", "ARRAY[box '((1,2),(3,4))', box '((0,0),(1,1))']", "'{}'", N, N,
            avro="{c}::text[]", json="to_json({c}::text[])"),
    )),
    CatalogTable("custom_types", (
        col("e", "mood", "'happy'", "'sad'", N, avro=TEXT, json=TEXT),
        col("ea", "mood[]", "'{ok,NULL,happy}'", "'{}'", N, avro="{c}::text[]", json="to_json({c}::text[])"),
        col("p", "price", "12.3", "0", N, avro="{c}::numeric", json=TEXT),
        col("pa", "price[]", "ARRAY[1.5, NULL]::price[]", "'{}'", N,
            avro="{c}::numeric[]", json="to_json({c}::text[])"),
        col("st", "short_text", "'dömäin'", "''", N, avro=TEXT, json=TEXT),
        col("cp", "pair", "ROW(1, 'a \"b\"')::pair", "ROW(NULL, NULL)::pair", N, avro=TEXT, json=TEXT),
        col("h", "hstore", "'\"a\"=>\"1\", \"b\"=>NULL, \"q\\\"k\"=>\"v\\\\w\", \"é\"=>\"\"'", "''", N,
            avro="hstore_to_json({c})", json="hstore_to_json({c})"),
    )),
    CatalogTable("everything_else", tuple(
        col(name, sql_type, value, N, avro=TEXT, json=TEXT)
        for name, sql_type, value in (
            ("inet", "inet", "'192.168.0.1/24'"),
            ("cidr", "cidr", "'10.0.0.0/8'"),
            ("mac", "macaddr", "'08:00:2b:01:02:03'"),
            ("mac8", "macaddr8", "'08:00:2b:01:02:03:04:05'"),
            ("bits", "bit(4)", "B'1010'"),
            ("vbits", "varbit", "B'101'"),
            ("ir", "int4range", "'[1,10)'"),
            ("tr", "tstzrange", "'[2024-01-01 00:00+00,)'"),
            ("nr", "numrange", "'(1.5,2.5]'"),
            ("dr", "daterange", "'empty'"),
            ("mr", "int4multirange", "'{[1,3), [5,7)}'"),
            ("pt", "point", "'(1.5,-2)'"),
            ("ln", "line", "'{1,-1,0}'"),
            ("ls", "lseg", "'[(0,0),(1,1)]'"),
            ("bx", "box", "'((0,0),(1,1))'"),
            ("pth", "path", "'[(0,0),(1,1),(2,0)]'"),
            ("pg", "polygon", "'((0,0),(1,1),(1,0))'"),
            ("cr", "circle", "'<(0,0),2>'"),
            ("tsv", "tsvector", "to_tsvector('english', 'The quick brown foxes')"),
            ("tsq", "tsquery", "'fox & dog'"),
            ("x", "xml", "'<a b=\"c\">é</a>'"),
            ("lsn", "pg_lsn", "'16/B374D848'"),
        )
    )),
    CatalogTable("crêpes", (
        col("person.name/surname", "text", "'Ada'", N),
        col("1st", "integer", "1", N),
        col("a_sixty_three_character_column_name_" + "x" * 27, "text", "'long'", N),
    ), schema="Sales Dept"),
    CatalogTable("a_sixty_three_character_table_name_" + "y" * 28, (col("v", "text", "'w'", N),)),
)  # fmt: skip

# Arrays that no Avro or JSON array can hold without altering them.
UNREPRESENTABLE_ARRAYS = ("'{{1,2},{3,4}}'::int4[]", "'[0:1]={1,2}'::int4[]")
