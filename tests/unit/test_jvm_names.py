"""JVM names resolved once (`shared_connections.jvm_names`), on the unit tier's real JVM: what
py4j resolves again costs a round trip each, counted here on the session's own gateway client."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from shared_connections import jvm_names
from tests.unit.jvm_round_trips import round_trips

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_a_class_and_its_static_method_are_resolved_once(spark: SparkSession) -> None:
    jvm: Any = spark.sparkContext._jvm
    from pyspark.sql import functions as F

    F.lit(1)  # resolved once, by PySpark itself
    with round_trips(spark) as sent:
        for _ in range(3):
            column = F.lit(7)
    assert len(sent) == 3, sent  # the calls themselves, no lookup of `functions` or `lit`
    assert spark.range(1).select(column.alias("x")).collect()[0]["x"] == 7
    with round_trips(spark) as sent:
        first = jvm.java.util.zip.CRC32
    assert 1 <= len(sent) <= 4  # java, util, zip, CRC32: at most once each (others may have asked)
    with round_trips(spark) as sent:
        assert jvm.java.util.zip.CRC32 is first
        crc = first()  # kept: its release would be one more command
        assert crc.getValue() == 0
    assert len(sent) == 2, sent  # the constructor and the call, no lookup


def test_a_static_field_is_read_anew_and_a_missing_name_fails_each_time(spark: SparkSession) -> None:
    from py4j.protocol import Py4JError

    jvm: Any = spark.sparkContext._jvm
    assert jvm.java.lang.Integer.MAX_VALUE == 2**31 - 1
    with round_trips(spark) as sent:
        assert jvm.java.lang.Integer.MAX_VALUE == 2**31 - 1
    assert len(sent) == 1  # a field's value is not remembered
    for _ in range(2):
        with pytest.raises(Py4JError, match="does not exist"):
            jvm.java.lang.Integer.noSuchMember  # noqa: B018 (the lookup is the test)


def test_remember_is_idempotent(spark: SparkSession) -> None:
    from py4j.java_gateway import JVMView

    before = JVMView.__getattr__
    jvm_names.remember()
    assert JVMView.__getattr__ is before
    assert spark.range(3).count() == 3
