"""Kafka records -> typed rows in Python (fastavro in `mapInArrow`): the reference decoder.

The merge decodes with Spark's own expressions (`spark_jobs.decoding.spark_decode`: from_avro,
from_json), which run in the JVM without a Python worker per record. This module stays as the
executable statement of what each type becomes in the lake: tests/integration/test_spark_decode.py
holds the two equal on every type of the catalog. The frame is stripped here and fastavro's C reader
decodes each message with its own writer schema.

Output columns: the table's columns (the union over the writer schema versions in the batch, in
order), then `_bw_lsn`, `_bw_seq`, `_bw_op`, `_bw_commit_ts`, `_bw_unchanged`, and the Kafka
partition and offset (`spark_jobs.decoding.spark_envelope.META_FIELDS`).
"""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from kafka_contract.framing import parse_frame
from kafka_contract.headers import OP_DELETE, WireFormatError, iso_micros, parse_headers
from spark_jobs.decoding.spark_envelope import META_FIELDS
from spark_jobs.decoding.spark_types import (
    SPARK_MAX_DAYS,
    SPARK_MAX_MICROS,
    SPARK_MIN_DAYS,
    SPARK_MIN_MICROS,
    record_columns,
)
from tests.reference import wire
from tests.reference.avro_values import Converter, field_converters, strip_logical_types

if TYPE_CHECKING:
    import pyarrow as pa

_DATE = re.compile(r"([+-]?\d{4,})-(\d\d)-(\d\d)")  # the worker writes years past 9999 as +YYYYY
_INFINITY, _NEG_INFINITY = "infinity", "-infinity"
_MAX_DATETIME_YEAR = 9999


def output_schema(columns: Sequence[tuple[str, DataType]]) -> StructType:
    return StructType([StructField(n, t, True) for n, t in columns] + META_FIELDS)


@dataclass
class _AvroPlan:
    parsed: Any
    # (field name, output index, converter) per field of this writer schema version
    fields: list[tuple[str, int, Converter | None]]


@dataclass
class AvroBatchDecoder:
    """Decodes one table topic's Avro messages; picklable, compiled lazily in each worker."""

    key_schemas: dict[int, dict[str, Any]]
    value_schemas: dict[int, dict[str, Any]]
    columns: list[tuple[str, DataType]]
    _plans: dict[tuple[str, int], _AvroPlan] = field(default_factory=dict, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "key_schemas": self.key_schemas,
            "value_schemas": self.value_schemas,
            "columns": self.columns,
            "_plans": {},
        }

    def _plan(self, part: str, schema_id: int) -> _AvroPlan:
        plan = self._plans.get((part, schema_id))
        if plan is None:
            import fastavro

            schemas = self.key_schemas if part == "key" else self.value_schemas
            if schema_id not in schemas:
                raise WireFormatError(f"{part} schema id {schema_id} was not fetched for this batch")
            schema = schemas[schema_id]
            index = {name: i for i, (name, _) in enumerate(self.columns)}
            converters = field_converters(schema)
            fields = [(s.field, index[s.name], converters[s.name]) for s in record_columns(schema)]
            plan = _AvroPlan(fastavro.parse_schema(strip_logical_types(schema)), fields)
            self._plans[(part, schema_id)] = plan
        return plan

    def record(self, data: bytes, part: str, row: list[Any]) -> None:
        from fastavro import schemaless_reader

        schema_id, offset = parse_frame(data)
        plan = self._plan(part, schema_id)
        record: dict[str, Any] = schemaless_reader(io.BytesIO(data[offset:]), plan.parsed, None)  # type: ignore[assignment]
        for field_name, out, convert in plan.fields:
            value = record.get(field_name)
            row[out] = value if value is None or convert is None else convert(value)


@dataclass
class JsonBatchDecoder:
    """Decodes one table topic's JSON messages into the given columns (types from the lake or catalog)."""

    columns: list[tuple[str, DataType]]

    def record(self, data: bytes, part: str, row: list[Any]) -> None:
        obj = json.loads(data)
        if not isinstance(obj, dict):
            raise WireFormatError(f"JSON {part} is not an object: {data[:80]!r}")
        for out, (name, data_type) in enumerate(self.columns):
            if name in obj:
                value = obj[name]
                row[out] = None if value is None else json_value(value, data_type)


def decode_batches(
    decoder: AvroBatchDecoder | JsonBatchDecoder, arrow_schema: pa.Schema
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The `mapInArrow` function: Kafka source columns in, decoded columns plus metadata out."""

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        width = len(decoder.columns)
        ts_cache: dict[bytes, int] = {}
        for batch in batches:
            keys = batch.column("key").to_pylist()
            values = batch.column("value").to_pylist()
            headers = batch.column("headers").to_pylist()
            partitions = batch.column("partition").to_pylist()
            offsets = batch.column("offset").to_pylist()
            topics = batch.column("topic").to_pylist()
            rows: list[list[Any]] = []
            for i, key in enumerate(keys):
                row: list[Any] = [None] * (width + len(META_FIELDS))
                try:
                    meta = parse_headers(
                        {h["key"]: h["value"] for h in headers[i] or () if h["value"] is not None}, ts_cache
                    )
                    if key is not None:
                        decoder.record(key, "key", row)
                    elif values[i] is None:
                        # An unkeyed table's messages have no key, but its deletes are never published.
                        raise WireFormatError("a message with neither key nor value")
                    if values[i] is not None:
                        decoder.record(values[i], "value", row)
                except (ValueError, KeyError, EOFError, IndexError) as exc:
                    raise WireFormatError(
                        f"topic {topics[i]} partition {partitions[i]} offset {offsets[i]}: {exc}"
                    ) from exc
                op = OP_DELETE if values[i] is None else meta.op
                row[width:] = [
                    meta.lsn,
                    meta.seq,
                    op,
                    meta.commit_ts_micros,
                    list(meta.unchanged) or None,
                    partitions[i],
                    offsets[i],
                ]
                rows.append(row)
            arrays = [
                pa.array(list(column) if rows else [], type=arrow_schema.field(j).type)
                for j, column in enumerate(zip(*rows, strict=True) if rows else [[]] * len(arrow_schema))
            ]
            yield pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)

    return decode


# --- JSON values -> Spark values ----------------------------------------------------------------


def json_value(value: Any, data_type: DataType) -> Any:
    """A plain JSON value of the contract -> the value Arrow takes for `data_type`."""
    if isinstance(data_type, StringType):
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if isinstance(data_type, (IntegerType, LongType)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise WireFormatError(
                f"{value!r} in a column the lake types {data_type.simpleString()} (inferred from earlier "
                "messages): pass --postgres to type JSON columns from the catalog"
            )
        return value
    if isinstance(data_type, BooleanType):
        return value
    if isinstance(data_type, (FloatType, DoubleType)):
        return float(value)
    if isinstance(data_type, DecimalType):
        return Decimal(str(value))
    if isinstance(data_type, BinaryType):
        return base64.b64decode(value)
    if isinstance(data_type, DateType):
        return json_date_days(value)
    if isinstance(data_type, (TimestampType, TimestampNTZType)):
        return json_timestamp_micros(value)
    if isinstance(data_type, ArrayType):
        return [None if v is None else json_value(v, data_type.elementType) for v in value]
    if isinstance(data_type, MapType):
        return {k: None if v is None else json_value(v, data_type.valueType) for k, v in value.items()}
    if isinstance(data_type, StructType):
        if isinstance(value, str):
            return wire.interval_from_iso(value)
        return {
            f.name: None if value.get(f.name) is None else json_value(value[f.name], f.dataType)
            for f in data_type.fields
        }
    return value


def json_date_days(text: str) -> int:
    if text == _INFINITY:
        return SPARK_MAX_DAYS
    if text == _NEG_INFINITY:
        return SPARK_MIN_DAYS
    match = _DATE.match(text)
    if match is None:
        raise WireFormatError(f"unreadable JSON date {text!r}")
    year, month, day = (int(g) for g in match.groups())
    return wire.clamp_days(days_from_civil(year, month, day))


def json_timestamp_micros(text: str) -> int:
    if text == _INFINITY:
        return SPARK_MAX_MICROS
    if text == _NEG_INFINITY:
        return SPARK_MIN_MICROS
    match = _DATE.match(text)
    if match is not None and not 1 <= int(match.group(1)) <= _MAX_DATETIME_YEAR:
        # Outside what Spark can show: the nearer end of its range, as for the infinities.
        return SPARK_MIN_MICROS if text.startswith("-") or int(match.group(1)) < 1 else SPARK_MAX_MICROS
    return iso_micros(text)


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm)."""
    year -= month <= 2
    era = (year if year >= 0 else year - 399) // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468
