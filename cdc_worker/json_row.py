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
JsonTextConverter = Callable[[str], str]


def compile_json_writer(
    names: Sequence[str], converters: Sequence[JsonTextConverter | None], *, nullable: bool = True
) -> JsonRowWriter:
    """A function writing one row (a value per name, None for NULL) as a UTF-8 JSON object.

    With `nullable=False` (keys) a None value makes the writer raise TypeError instead of writing null.
    """
    if len(names) != len(converters):
        raise ValueError(f"{len(converters)} converters for {len(names)} columns")
    if not names:
        return lambda row: b"{}"
    scope: dict[str, Any] = {}
    parts: list[str] = []
    for index, (name, converter) in enumerate(zip(names, converters, strict=True)):
        scope[f"_k{index}"] = ("{" if index == 0 else ",") + encode_basestring(name) + ":"
        value = f"r[{index}]"
        if converter is not None:
            scope[f"_j{index}"] = converter
        if nullable:
            converted = "v" if converter is None else f"_j{index}(v)"
            parts.append(f"_k{index}, 'null' if (v := {value}) is None else {converted}")
        else:
            parts.append(f"_k{index}, " + (value if converter is None else f"_j{index}({value})"))
    joined = ",\n        ".join(parts)
    source = f"def write(r):\n    return ''.join((\n        {joined},\n        '}}',\n    )).encode()\n"
    # Column names live in `scope` as values, never in the source: the code holds indexes only.
    exec(compile(source, "<json writer>", "exec"), scope)
    writer: JsonRowWriter = scope["write"]
    writer.__doc__ = source
    return writer
