"""Postgres's builtin type OIDs and what a column's typmod means for them.

pgoutput names a column's type only by OID and typmod. Builtin OIDs are fixed by `pg_type.dat`
(they never change between versions), so they are named here; every other type (enums, domains,
extension types such as hstore and citext, arrays of those) is resolved through the `TypeInfo`s the
shell loads from `pg_type`. The integration tests check every member below against a live catalog.
"""

from __future__ import annotations

import enum

# atttypmod of a column without a modifier (plain `numeric`, `varchar`, `timestamp`).
NO_TYPMOD = -1
# Length and numeric typmods count the 4-byte varlena header (`VARHDRSZ` in the server).
VARHDRSZ = 4
# numeric's typmod packs the precision in the high 16 bits and the scale in the low 11, signed
# since Postgres 15 (`numeric(3, -2)`): see `make_numeric_typmod` in numeric.c.
_NUMERIC_PRECISION_SHIFT = 16
_NUMERIC_PRECISION_MASK = 0xFFFF
_NUMERIC_SCALE_MASK = 0x7FF
_NUMERIC_SCALE_SIGN = 0x400
# interval's typmod packs the field mask (high 16 bits) with the fractional-second precision.
_INTERVAL_PRECISION_MASK = 0xFFFF


class PgType(enum.IntEnum):
    """Builtin scalar types (`pg_type.oid`), named after `pg_type.typname`."""

    BOOL = 16
    BYTEA = 17
    CHAR = 18
    NAME = 19
    INT8 = 20
    INT2 = 21
    INT4 = 23
    REGPROC = 24
    TEXT = 25
    OID = 26
    TID = 27
    XID = 28
    CID = 29
    JSON = 114
    XML = 142
    POINT = 600
    LSEG = 601
    PATH = 602
    BOX = 603
    POLYGON = 604
    LINE = 628
    CIDR = 650
    FLOAT4 = 700
    FLOAT8 = 701
    CIRCLE = 718
    MACADDR8 = 774
    MONEY = 790
    MACADDR = 829
    INET = 869
    ACLITEM = 1033
    BPCHAR = 1042
    VARCHAR = 1043
    DATE = 1082
    TIME = 1083
    TIMESTAMP = 1114
    TIMESTAMPTZ = 1184
    INTERVAL = 1186
    TIMETZ = 1266
    BIT = 1560
    VARBIT = 1562
    NUMERIC = 1700
    REFCURSOR = 1790
    REGPROCEDURE = 2202
    REGOPER = 2203
    REGOPERATOR = 2204
    REGCLASS = 2205
    REGTYPE = 2206
    UUID = 2950
    TXID_SNAPSHOT = 2970
    PG_LSN = 3220
    TSVECTOR = 3614
    TSQUERY = 3615
    GTSVECTOR = 3642
    REGCONFIG = 3734
    REGDICTIONARY = 3769
    JSONB = 3802
    INT4RANGE = 3904
    NUMRANGE = 3906
    TSRANGE = 3908
    TSTZRANGE = 3910
    DATERANGE = 3912
    INT8RANGE = 3926
    JSONPATH = 4072
    REGNAMESPACE = 4089
    REGROLE = 4096
    REGCOLLATION = 4191
    INT4MULTIRANGE = 4451
    NUMMULTIRANGE = 4532
    TSMULTIRANGE = 4533
    TSTZMULTIRANGE = 4534
    DATEMULTIRANGE = 4535
    INT8MULTIRANGE = 4536
    PG_SNAPSHOT = 5038
    XID8 = 5069


class PgArrayType(enum.IntEnum):
    """Builtin array types (`pg_type.typarray` of the scalar type of the same member name)."""

    BOOL = 1000
    BYTEA = 1001
    CHAR = 1002
    NAME = 1003
    INT8 = 1016
    INT2 = 1005
    INT4 = 1007
    REGPROC = 1008
    TEXT = 1009
    OID = 1028
    TID = 1010
    XID = 1011
    CID = 1012
    JSON = 199
    XML = 143
    POINT = 1017
    LSEG = 1018
    PATH = 1019
    BOX = 1020
    POLYGON = 1027
    LINE = 629
    CIDR = 651
    FLOAT4 = 1021
    FLOAT8 = 1022
    CIRCLE = 719
    MACADDR8 = 775
    MONEY = 791
    MACADDR = 1040
    INET = 1041
    ACLITEM = 1034
    BPCHAR = 1014
    VARCHAR = 1015
    DATE = 1182
    TIME = 1183
    TIMESTAMP = 1115
    TIMESTAMPTZ = 1185
    INTERVAL = 1187
    TIMETZ = 1270
    BIT = 1561
    VARBIT = 1563
    NUMERIC = 1231
    REFCURSOR = 2201
    REGPROCEDURE = 2207
    REGOPER = 2208
    REGOPERATOR = 2209
    REGCLASS = 2210
    REGTYPE = 2211
    UUID = 2951
    TXID_SNAPSHOT = 2949
    PG_LSN = 3221
    TSVECTOR = 3643
    TSQUERY = 3645
    GTSVECTOR = 3644
    REGCONFIG = 3735
    REGDICTIONARY = 3770
    JSONB = 3807
    INT4RANGE = 3905
    NUMRANGE = 3907
    TSRANGE = 3909
    TSTZRANGE = 3911
    DATERANGE = 3913
    INT8RANGE = 3927
    JSONPATH = 4073
    REGNAMESPACE = 4090
    REGROLE = 4097
    REGCOLLATION = 4192
    INT4MULTIRANGE = 6150
    NUMMULTIRANGE = 6151
    TSMULTIRANGE = 6152
    TSTZMULTIRANGE = 6153
    DATEMULTIRANGE = 6155
    INT8MULTIRANGE = 6157
    PG_SNAPSHOT = 5039
    XID8 = 271


# Array type OID -> element type OID, for every builtin array type.
ARRAY_ELEMENT: dict[int, PgType] = {array: PgType[array.name] for array in PgArrayType}

# Every builtin type writes array elements separated by a comma except box, whose text output
# itself holds commas (`pg_type.typdelim`).
ARRAY_DELIMITER = ","
ARRAY_DELIMITER_OVERRIDES: dict[int, str] = {PgType.BOX: ";"}


def numeric_precision_scale(typmod: int) -> tuple[int, int] | None:
    """`numeric(p, s)`'s precision and scale, or None for a numeric without typmod."""
    if typmod < VARHDRSZ:
        return None
    packed = typmod - VARHDRSZ
    precision = (packed >> _NUMERIC_PRECISION_SHIFT) & _NUMERIC_PRECISION_MASK
    scale = ((packed & _NUMERIC_SCALE_MASK) ^ _NUMERIC_SCALE_SIGN) - _NUMERIC_SCALE_SIGN
    return precision, scale


def character_length(typmod: int) -> int | None:
    """The declared length of `varchar(n)` / `char(n)`, or None when unbounded."""
    return typmod - VARHDRSZ if typmod >= VARHDRSZ else None


def bit_length(typmod: int) -> int | None:
    """The declared length of `bit(n)` / `varbit(n)` (stored without a header), or None."""
    return typmod if typmod >= 0 else None


def time_precision(typmod: int) -> int | None:
    """Fractional-second digits of `time(p)`, `timetz(p)`, `timestamp(p)`, `timestamptz(p)`."""
    return typmod if typmod >= 0 else None


def interval_precision(typmod: int) -> int | None:
    """Fractional-second digits of `interval(p)`, or None when not restricted."""
    if typmod < 0:
        return None
    precision = typmod & _INTERVAL_PRECISION_MASK
    return None if precision == _INTERVAL_PRECISION_MASK else precision


def type_modifier_suffix(type_oid: int, typmod: int) -> str:
    """The `(…)` that `format_type` would print after a builtin type's name, or ''."""
    if typmod == NO_TYPMOD:
        return ""
    if type_oid == PgType.NUMERIC:
        precision_scale = numeric_precision_scale(typmod)
        return "" if precision_scale is None else "({},{})".format(*precision_scale)
    if type_oid in (PgType.VARCHAR, PgType.BPCHAR):
        length = character_length(typmod)
    elif type_oid in (PgType.BIT, PgType.VARBIT):
        length = bit_length(typmod)
    elif type_oid in (PgType.TIME, PgType.TIMETZ, PgType.TIMESTAMP, PgType.TIMESTAMPTZ):
        length = time_precision(typmod)
    elif type_oid == PgType.INTERVAL:
        length = interval_precision(typmod)
    else:
        length = None
    return "" if length is None else f"({length})"
