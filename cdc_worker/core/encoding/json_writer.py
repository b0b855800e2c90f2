"""A per-table compiled JSON object writer: pgoutput's text in, one UTF-8 JSON object out.

The column converters return ready JSON text (`pgtypes.ColumnType.to_json`; None where the text is
JSON already: integers, json and jsonb), so a row needs no intermediate Python values and no
`json.dumps` walk. jsonb is spliced in verbatim, which also keeps numbers that a float would round.
Keys are the original column names, JSON-escaped once at compile time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from json.encoder import encode_basestring
from typing import Any

JsonRowWriter = Callable[[Sequence[Any]], bytes]
KeyedJsonRowWriter = Callable[[Sequence[Any]], tuple[bytes, bytes]]
JsonTextConverter = Callable[[str], str]


def compile_json_writer(
    names: Sequence[str], converters: Sequence[JsonTextConverter | None], *, nullable: bool = True
) -> JsonRowWriter:
    """A function writing one row (a value per name, None for NULL) as a UTF-8 JSON object.

    With `nullable=False` (keys) a None value makes the writer raise TypeError instead of writing null.
    """
    _check(names, converters)
    scope: dict[str, Any] = {}
    parts = _object_parts(names, converters, range(len(names)), scope, "v", nullable=nullable)
    source = f"def write(r):\n    return {parts}.encode()\n"
    writer: JsonRowWriter = _build(source, scope)
    return writer


def compile_keyed_json_writer(
    names: Sequence[str], converters: Sequence[JsonTextConverter | None], key_fields: Sequence[int]
) -> KeyedJsonRowWriter:
    """`write(row) -> (key, value)`: the key object (columns `key_fields`, not nullable) and the
    value object from one row in one call."""
    _check(names, converters)
    scope: dict[str, Any] = {}
    key = _object_parts(
        [names[i] for i in key_fields], [converters[i] for i in key_fields], key_fields, scope, "k"
    )
    value = _object_parts(names, converters, range(len(names)), scope, "v", nullable=True)
    source = f"def write(r):\n    return {key}.encode(), {value}.encode()\n"
    writer: KeyedJsonRowWriter = _build(source, scope)
    return writer


def _check(names: Sequence[str], converters: Sequence[JsonTextConverter | None]) -> None:
    if len(names) != len(converters):
        raise ValueError(f"{len(converters)} converters for {len(names)} columns")


def _object_parts(
    names: Sequence[str],
    converters: Sequence[JsonTextConverter | None],
    indexes: Sequence[int],
    scope: dict[str, Any],
    stem: str,
    *,
    nullable: bool = False,
) -> str:
    """The expression joining one JSON object from row values `indexes` (names in `scope`)."""
    if not names:
        return "'{}'"
    parts: list[str] = []
    for position, (name, converter, index) in enumerate(zip(names, converters, indexes, strict=True)):
        scope[f"_{stem}{position}"] = ("{" if position == 0 else ",") + encode_basestring(name) + ":"
        value = f"r[{index}]"
        if converter is not None:
            scope[f"_j{index}"] = converter
        if nullable:
            converted = "v" if converter is None else f"_j{index}(v)"
            parts.append(f"_{stem}{position}, 'null' if (v := {value}) is None else {converted}")
        else:
            parts.append(f"_{stem}{position}, " + (value if converter is None else f"_j{index}({value})"))
    return "''.join((" + ", ".join(parts) + ", '}'))"


def _build(source: str, scope: dict[str, Any]) -> Any:
    # Column names live in `scope` as values, never in the source: the code holds indexes only.
    exec(compile(source, "<json writer>", "exec"), scope)
    writer = scope["write"]
    writer.__doc__ = source
    return writer
