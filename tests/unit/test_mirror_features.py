"""`--mirror-features`: which Delta table features new tables get, how a table's own are read back,
and how the setting travels from the environment to the merge's command line and options."""

from __future__ import annotations

import pytest

from orchestration.continuous_merge import merge_command
from orchestration.resources import DeltaWarehouseResource, KafkaResource, SparkResource
from orchestration.settings import SettingsError, load_settings
from spark_jobs import option_parser
from spark_jobs.errors import ConfigurationError
from spark_jobs.rules import mirror_features


def test_portable_tables_turn_both_features_off_and_ask_for_the_oldest_protocol() -> None:
    portable = mirror_features.creation_properties("portable")
    assert portable["delta.columnMapping.mode"] == "none"
    assert portable["delta.enableDeletionVectors"] == "false"
    assert (portable["delta.minReaderVersion"], portable["delta.minWriterVersion"]) == ("1", "2")
    default = mirror_features.creation_properties("default")
    assert default["delta.columnMapping.mode"] == "name"
    assert default["delta.enableDeletionVectors"] == "true"


def test_a_tables_setting_is_read_from_its_column_mapping() -> None:
    # Created before deletion vectors were the default: column mapping alone, still `default`.
    assert mirror_features.of_table({"delta.columnMapping.mode": "name"}) == "default"
    assert mirror_features.of_table(mirror_features.creation_properties("default")) == "default"
    assert mirror_features.of_table(mirror_features.creation_properties("portable")) == "portable"
    assert mirror_features.of_table({}) == "portable"


def test_names_only_column_mapping_can_hold_are_named_with_the_ways_out() -> None:
    assert mirror_features.invalid_names(["id", "credit limit", "a.b", "x=y", "ok_1"]) == [
        "credit limit",
        "x=y",
    ]
    message = mirror_features.invalid_names_message("/lake/public/t", ["credit limit"])
    assert "'credit limit'" in message and "--mirror-features default" in message
    assert "\n" not in message


def test_a_table_keeps_its_setting_and_the_line_names_the_rebuild() -> None:
    message = mirror_features.kept_message("/lake/public/t", "default", "portable")
    assert "keeps it" in message and "spark_jobs.rebuild" in message
    assert "--mirror-features portable" in message


def test_the_setting_is_parsed_in_any_case_and_refused_in_one_line_otherwise() -> None:
    assert mirror_features.parse(" Portable ") == "portable"
    assert mirror_features.parse("") is None and mirror_features.parse(None) is None
    with pytest.raises(
        ConfigurationError, match=r"BW_MIRROR_FEATURES.*'fast': expected one of default, portable"
    ):
        option_parser.mirror_features("fast")


def test_the_merge_and_the_rebuild_take_it_from_the_flag_or_the_environment() -> None:
    merge = option_parser.build_parser("merge", "", environ={"BW_MIRROR_FEATURES": "portable"})
    parsed = merge.parse_args(["-b", "k:9092", "--warehouse", "w", "--checkpoints", "c"])
    assert option_parser.mirror_features(parsed.mirror_features) == "portable"
    rebuild = option_parser.build_parser("rebuild", "", environ={})
    parsed = rebuild.parse_args(["--warehouse", "w", "--table", "public.a"])
    # Not given: the rebuild keeps the replaced mirror's features (`rebuild.existing_features`).
    assert parsed.mirror_features is None
    with pytest.raises(SystemExit):
        option_parser.build_parser("maintenance", "", environ={}).parse_args(
            ["--warehouse", "w", "--mirror-features", "portable"]
        )


def test_dagster_passes_the_variable_to_the_continuous_merges_command_line() -> None:
    settings = load_settings({"BW_MIRROR_FEATURES": "portable"})
    assert settings.mirror_features == "portable"
    assert load_settings({}).mirror_features == "default"
    with pytest.raises(SettingsError, match="BW_MIRROR_FEATURES='x'"):
        load_settings({"BW_MIRROR_FEATURES": "x"})
    command = merge_command(
        [],
        10.0,
        kafka=KafkaResource(bootstrap_servers="k:9092", message_format="avro"),
        warehouse=DeltaWarehouseResource(root="/lake", mirror_features=settings.mirror_features),
        spark=SparkResource(),
    )
    parsed = option_parser.build_parser("merge", "", environ={}).parse_args(
        command[command.index("spark_jobs.merge") + 1 :]
    )
    assert parsed.mirror_features == "portable"
    with pytest.raises(ValueError, match="expected one of"):
        DeltaWarehouseResource(root="/lake", mirror_features="fast").features()
