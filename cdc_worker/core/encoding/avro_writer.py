"""A per-schema compiled Avro binary writer: the hot path's replacement for fastavro's writer.

fastavro's generic writer walks the schema for every datum and resolves each union branch by
checking the value's type (about 90k rows/s for ten `["null", T]` fields). Our schemas are known
once per relation version and every union is `["null", T]`, so `compile_record_writer` generates one
straight-line Python function per schema instead: zigzag varints from precomputed tables, union
branch bytes merged into the value's first bytes, and (optionally) the per-column text converters
called inline, so a row goes from pgoutput's text to Avro bytes in one call with no dispatch.

The output is byte for byte what `fastavro.schemaless_writer` writes for the same values (the tests
check it with generated schemas and values), including fastavro's choices where Avro leaves room:
arrays and maps as one block followed by the zero terminator, decimals sized by `decimal_bytes`.

Values are the Avro primitive values (the `to_avro` converters' output): int for int/long and the
date/time logical types, bytes for decimals, dict for nested records, list for arrays, dict for maps.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import cache
from typing import Any

# Varints below this bound (two 7-bit groups) come from a table instead of a loop.
_TABLE_BITS = 14
VARINT_TABLE_SIZE = 1 << _TABLE_BITS
# Values below 2**56 (every timestamp in microseconds) are written from table pieces.
_TABLE_STEPS = 4
_VARINT_GROUP_BITS = 7
_VARINT_LOW_BITS = 0x7F
_VARINT_CONTINUATION = 0x80
# Avro's zigzag encoding maps a signed 64-bit n to (n << 1) ^ (n >> 63).
_SIGN_SHIFT = 63
# The union branch index, zigzag-encoded: 0 selects "null", 1 (0x02) selects the value's type.
NULL_BRANCH = b"\x00"
VALUE_BRANCH = b"\x02"
# fastavro writes every array and map as one block, ended by a zero count.
END_OF_BLOCKS = b"\x00"
PRIMITIVE_TYPES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_INT_TYPES = frozenset({"int", "long"})
_BYTES_TYPES = frozenset({"string", "bytes"})

RecordWriter = Callable[[Sequence[Any]], bytes]
KeyedRecordWriter = Callable[[Sequence[Any]], tuple[bytes, bytes]]
# A reader fused in front of the writer: `buf` -> (key or None, value), or None when it declines.
FusedWriter = Callable[[bytes], tuple[bytes | None, bytes] | None]
TextConverter = Callable[[str], Any]


class UnsupportedSchema(ValueError):
    """A schema construct this writer does not generate code for (use fastavro instead)."""


def varint(value: int) -> bytes:
    """An unsigned base-128 varint (the zigzag step is the caller's)."""
    out = bytearray()
    while value >= _VARINT_CONTINUATION:
        out.append((value & _VARINT_LOW_BITS) | _VARINT_CONTINUATION)
        value >>= _VARINT_GROUP_BITS
    out.append(value)
    return bytes(out)


def zigzag_long(value: int) -> bytes:
    """Avro's encoding of an int or long."""
    return varint((value << 1) ^ (value >> _SIGN_SHIFT))


@cache
def _varint_tables() -> dict[str, tuple[bytes, ...]]:
    """Varint pieces for values below VARINT_TABLE_SIZE, built on first use (about 2 MB).

    `_V`: the complete varint of n; `_UV`: the same behind the union's value-branch byte;
    `_C`: n's two 7-bit groups, both with the continuation bit, for the low groups of a bigger value;
    `_UC`: the same behind the union byte. A timestamp's 8-byte varint is then four lookups instead
    of an 8-step loop, which made the loop the writer's largest cost.
    """
    plain = tuple(varint(n) for n in range(VARINT_TABLE_SIZE))
    continued = tuple(
        bytes(
            [
                (n & _VARINT_LOW_BITS) | _VARINT_CONTINUATION,
                ((n >> _VARINT_GROUP_BITS) & _VARINT_LOW_BITS) | _VARINT_CONTINUATION,
            ]
        )
        for n in range(VARINT_TABLE_SIZE)
    )
    return {
        "_V": plain,
        "_UV": tuple(VALUE_BRANCH + encoded for encoded in plain),
        "_C": continued,
        "_UC": tuple(VALUE_BRANCH + encoded for encoded in continued),
    }


class _CodeGenerator:
    """Emits the statements of one writer function; complex types recurse with fresh variables."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.named: dict[str, Mapping[str, Any]] = {}
        # Variables holding a string field's UTF-8 bytes already (`raw_strings`): written as they are.
        self.raw_vars: set[str] = set()
        self._counter = 0

    def fresh(self, stem: str) -> str:
        self._counter += 1
        return f"{stem}{self._counter}"

    def emit(self, schema: Any, var: str, indent: str, tagged: bool, namespace: str | None) -> None:
        """Write `var` as `schema`; `tagged` means the union's value-branch byte must come first."""
        if isinstance(schema, list):
            self._union(schema, var, indent, tagged, namespace)
            return
        if isinstance(schema, str):
            if schema in PRIMITIVE_TYPES:
                self._primitive(schema, var, indent, tagged)
                return
            full_name = schema if "." in schema or not namespace else f"{namespace}.{schema}"
            if full_name not in self.named:
                raise UnsupportedSchema(f"unknown named type {schema!r}")
            self._record(self.named[full_name], var, indent, tagged, namespace)
            return
        kind = schema.get("type")
        if kind == "record":
            self._register(schema, namespace)
            self._record(schema, var, indent, tagged, namespace)
        elif kind == "array":
            self._array(schema, var, indent, tagged, namespace)
        elif kind == "map":
            self._map(schema, var, indent, tagged, namespace)
        elif isinstance(kind, str):
            self._primitive(kind, var, indent, tagged)  # a logical type: its underlying primitive
        else:
            self.emit(kind, var, indent, tagged, namespace)

    def _line(self, indent: str, code: str) -> None:
        self.lines.append(indent + code)

    def _union(self, branches: list[Any], var: str, indent: str, tagged: bool, namespace: str | None) -> None:
        if len(branches) != 2 or branches[0] != "null" or tagged:  # only ["null", T]
            raise UnsupportedSchema(f"only ['null', T] unions are compiled, not {branches!r}")
        self._line(indent, f"if {var} is None:")
        self._line(indent + "    ", f"a({NULL_BRANCH!r})")
        self._line(indent, "else:")
        self.emit(branches[1], var, indent + "    ", True, namespace)

    def _primitive(self, kind: str, var: str, indent: str, tagged: bool) -> None:
        prefix = "b'\\x02' + " if tagged else ""
        table = "_UV" if tagged else "_V"
        if kind in _INT_TYPES:
            z = self.fresh("z")
            self._line(indent, f"{z} = ({var} << 1) ^ ({var} >> {_SIGN_SHIFT})")
            self._varint(z, indent, tagged)
        elif kind in _BYTES_TYPES:
            data = self.fresh("e")
            size = self.fresh("n")
            encoded = kind == "bytes" or var in self.raw_vars
            self._line(indent, f"{data} = {var}" if encoded else f"{data} = {var}.encode()")
            self._line(indent, f"{size} = len({data}) << 1  # lengths are zigzag longs")
            self._line(
                indent, f"a({table}[{size}] if {size} < {VARINT_TABLE_SIZE} else {prefix}_varint({size}))"
            )
            self._line(indent, f"a({data})")
        elif kind == "boolean":
            true, false = (b"\x02\x01", b"\x02\x00") if tagged else (b"\x01", b"\x00")
            self._line(indent, f"a({true!r} if {var} else {false!r})")
        elif kind in ("float", "double"):
            pack = "_pack_float" if kind == "float" else "_pack_double"
            self._line(indent, f"a({prefix}{pack}({var}))")
        elif kind == "null":
            if tagged:
                raise UnsupportedSchema("a union holding null twice")
        else:
            raise UnsupportedSchema(f"Avro type {kind!r} is not compiled")

    def _varint(self, z: str, indent: str, tagged: bool) -> None:
        """Append the varint of the non-negative `z`, from table pieces up to 8 bytes long."""
        first, low = ("_UV", "_UC") if tagged else ("_V", "_C")
        self._line(indent, f"if {z} < {VARINT_TABLE_SIZE}:")
        self._line(indent + "    ", f"a({first}[{z}])")
        # Each table piece holds two 7-bit groups: 14 bits per step.
        for groups in range(1, _TABLE_STEPS):
            self._line(indent, f"elif {z} < {1 << (_TABLE_BITS * (groups + 1))}:")
            pieces = [f"{low}[{z} & {VARINT_TABLE_SIZE - 1}]"]
            pieces += [f"_C[({z} >> {_TABLE_BITS * g}) & {VARINT_TABLE_SIZE - 1}]" for g in range(1, groups)]
            pieces.append(f"_V[{z} >> {_TABLE_BITS * groups}]")
            self._line(indent + "    ", "; ".join(f"a({piece})" for piece in pieces))
        self._line(indent, "else:")
        self._line(
            indent + "    ", f"a({'b' + repr(VALUE_BRANCH)[1:] + ' + ' if tagged else ''}_varint({z}))"
        )

    def _tag(self, indent: str, tagged: bool) -> None:
        if tagged:
            self._line(indent, f"a({VALUE_BRANCH!r})")

    def _array(
        self, schema: Mapping[str, Any], var: str, indent: str, tagged: bool, namespace: str | None
    ) -> None:
        self._tag(indent, tagged)
        item = self.fresh("x")
        self._line(indent, f"if {var}:")
        self._line(indent + "    ", f"a(_varint(len({var}) << 1))")
        self._line(indent + "    ", f"for {item} in {var}:")
        self.emit(schema["items"], item, indent + "        ", False, namespace)
        self._line(indent, f"a({END_OF_BLOCKS!r})")

    def _map(
        self, schema: Mapping[str, Any], var: str, indent: str, tagged: bool, namespace: str | None
    ) -> None:
        self._tag(indent, tagged)
        key, item = self.fresh("k"), self.fresh("x")
        self._line(indent, f"if {var}:")
        self._line(indent + "    ", f"a(_varint(len({var}) << 1))")
        self._line(indent + "    ", f"for {key}, {item} in {var}.items():")
        self._primitive("string", key, indent + "        ", False)
        self.emit(schema["values"], item, indent + "        ", False, namespace)
        self._line(indent, f"a({END_OF_BLOCKS!r})")

    def _record(
        self, schema: Mapping[str, Any], var: str, indent: str, tagged: bool, namespace: str | None
    ) -> None:
        self._tag(indent, tagged)
        inner_namespace = schema.get("namespace", namespace)
        for field in schema["fields"]:
            value = self.fresh("f")
            self._line(indent, f"{value} = {var}[{field['name']!r}]")
            self.emit(field["type"], value, indent, False, inner_namespace)

    def _register(self, schema: Mapping[str, Any], namespace: str | None) -> None:
        name = schema["name"]
        space = schema.get("namespace", namespace)
        full_name = name if "." in name or not space else f"{space}.{name}"
        self.named[full_name] = schema


def compile_record_writer(
    record_schema: Mapping[str, Any],
    converters: Sequence[TextConverter | None] | None = None,
    prefix: bytes = b"",
    *,
    raw_strings: Collection[int] = (),
) -> RecordWriter:
    """A function writing one record, given its field values in field order, as Avro binary.

    `converters`, one per field, are applied to each non-null value first (None: the value as is),
    which lets the caller pass pgoutput's text straight in. `prefix` (the Confluent framing) is
    written before the record. Values are trusted to be in range: the converters guarantee it.
    `raw_strings`: indexes of string fields (without converter) whose values come as their UTF-8
    bytes, which are the Avro string's bytes: the pgoutput fast path then never builds the `str`.
    """
    writer: RecordWriter = _compile(record_schema, converters, prefix, None, raw_strings)
    return writer


def compile_keyed_writer(
    record_schema: Mapping[str, Any],
    converters: Sequence[TextConverter | None] | None,
    prefix: bytes,
    *,
    key_schema: Mapping[str, Any],
    key_fields: Sequence[int],
    key_prefix: bytes,
    raw_strings: Collection[int] = (),
) -> KeyedRecordWriter:
    """Like `compile_record_writer`, but also writes the key record, whose fields are the record's
    fields `key_fields` (not nullable), from the same row: `write(row) -> (key, value)`.

    One call instead of two, and each key column is converted once for both records.
    """
    if len(key_fields) != len(key_schema["fields"]):
        raise ValueError(
            f"{len(key_fields)} key fields for the {len(key_schema['fields'])} of the key schema"
        )
    writer: KeyedRecordWriter = _compile(
        record_schema, converters, prefix, (key_schema, key_fields, key_prefix), raw_strings
    )
    return writer


def compile_fused_writer(
    record_schema: Mapping[str, Any],
    converters: Sequence[TextConverter | None] | None,
    prefix: bytes,
    *,
    key: tuple[Mapping[str, Any], Sequence[int], bytes] | None,
    raw_strings: Collection[int],
    reader: tuple[Sequence[str], Mapping[str, Any]],
) -> FusedWriter:
    """`compile_keyed_writer` (or, with `key` None, `compile_record_writer` with a None key) behind
    a reader, in one function of the message buffer `buf`: one call per row instead of two, and no
    row tuple. `reader` is the source lines (indented for a function body) that bind `v0`, `v1`, ...
    from `buf` or `return None`, and the names they use (`insert_reader.insert_reader_source`)."""
    writer: FusedWriter = _compile(record_schema, converters, prefix, key, raw_strings, reader=reader)
    return writer


def _compile(
    record_schema: Mapping[str, Any],
    converters: Sequence[TextConverter | None] | None,
    prefix: bytes,
    key: tuple[Mapping[str, Any], Sequence[int], bytes] | None,
    raw_strings: Collection[int],
    *,
    reader: tuple[Sequence[str], Mapping[str, Any]] | None = None,
) -> Any:
    fields = record_schema["fields"]
    converters = converters if converters is not None else [None] * len(fields)
    if len(converters) != len(fields):
        raise ValueError(f"{len(converters)} converters for {len(fields)} fields")
    generator = _CodeGenerator()
    for index in raw_strings:
        if converters[index] is not None or _primitive_of(fields[index]["type"]) != "string":
            raise UnsupportedSchema(f"field {index} cannot take raw bytes: not a string without converter")
        generator.raw_vars.add(f"v{index}")
    generator._register(record_schema, None)
    namespace = record_schema.get("namespace")
    scope: dict[str, Any] = {
        **_varint_tables(),
        "_varint": varint,
        "_pack_float": struct.Struct("<f").pack,
        "_pack_double": struct.Struct("<d").pack,
        "_PREFIX": prefix,
    }
    scope.update({f"_c{index}": converter for index, converter in enumerate(converters)})
    body = generator.lines
    if reader is not None:
        reader_lines, reader_scope = reader
        body += reader_lines
        scope.update(reader_scope)
    elif fields:  # one tuple unpacking instead of an index per field
        body.append("    " + ", ".join(f"v{index}" for index in range(len(fields))) + ", = r")
    converted: set[int] = set()
    if key is not None:
        key_schema, key_fields, scope["_KEY_PREFIX"] = key
        generator._register(key_schema, None)
        body.append("    out = [_KEY_PREFIX]")
        body.append("    a = out.append")
        for key_field, index in zip(key_schema["fields"], key_fields, strict=True):
            if converters[index] is not None:  # a NULL key value fails here or in the encoding
                body.append(f"    v{index} = _c{index}(v{index})")
                converted.add(index)
            generator.emit(key_field["type"], f"v{index}", "    ", False, key_schema.get("namespace"))
        body.append("    key = b''.join(out)")
    body.append("    out = [_PREFIX]" if prefix else "    out = []")
    body.append("    a = out.append")
    for index, field in enumerate(fields):
        converter = None if index in converted else converters[index]
        if converter is not None:
            _emit_converted(generator, field["type"], f"v{index}", f"_c{index}", namespace)
        else:
            generator.emit(field["type"], f"v{index}", "    ", False, namespace)
    if key is not None:
        body.append("    return key, b''.join(out)")
    else:
        body.append("    return None, b''.join(out)" if reader is not None else "    return b''.join(out)")
    source = f"def write({'buf' if reader is not None else 'r'}):\n" + "\n".join(body) + "\n"
    # The source is built from the schema's structure and constants only, never from column names.
    exec(compile(source, f"<avro writer {record_schema.get('name')}>", "exec"), scope)
    writer = scope["write"]
    writer.__doc__ = source  # kept for debugging: the generated code is the documentation
    return writer


def _emit_converted(
    generator: _CodeGenerator, schema: Any, var: str, converter: str, namespace: str | None
) -> None:
    """A top-level field whose text goes through `converter` first, skipped for NULL."""
    if isinstance(schema, list):
        if len(schema) != 2 or schema[0] != "null":  # only ["null", T]
            raise UnsupportedSchema(f"only ['null', T] unions are compiled, not {schema!r}")
        generator.lines.append(f"    if {var} is None:")
        generator.lines.append(f"        a({NULL_BRANCH!r})")
        generator.lines.append("    else:")
        generator.lines.append(f"        {var} = {converter}({var})")
        generator.emit(schema[1], var, "        ", True, namespace)
    else:
        generator.lines.append(f"    {var} = {converter}({var})")
        generator.emit(schema, var, "    ", False, namespace)


def _primitive_of(schema: Any) -> Any:
    """The primitive under a `["null", T]` union and a logical type, or the schema itself."""
    if isinstance(schema, list) and len(schema) == 2 and schema[0] == "null":
        schema = schema[1]
    while isinstance(schema, dict):
        schema = schema.get("type")
    return schema
