"""Spark's Kafka source options (the JVM client's names, `kafka.`-prefixed) as librdkafka settings,
for the merge's own small admin requests (listing the topics a `--topic-pattern` names): one set of
`--kafka-option`s secures both clients.

The JVM client takes its SASL credentials in a JAAS line and its CA in a truststore; librdkafka
takes `sasl.username`/`sasl.password` and `ssl.ca.location`. A truststore librdkafka cannot read
(JKS, PKCS12) is refused in one line naming the PEM form it can.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from spark_jobs.errors import ConfigurationError

# JVM-only settings with no librdkafka twin, or translated below.
_JVM_ONLY = {
    "sasl.jaas.config",
    "sasl.mechanism",
    "ssl.truststore.location",
    "ssl.truststore.type",
    "ssl.truststore.password",
    "ssl.truststore.certificates",
    "ssl.keystore.type",
    "ssl.keystore.location",
    "ssl.keystore.password",
    "ssl.key.password",
    "sasl.login.callback.handler.class",
    "sasl.client.callback.handler.class",
}
_JAAS_VALUE = re.compile(r'\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


class KafkaOptionError(ConfigurationError):
    """A `--kafka-option` the merge's admin client cannot use; the message names the fix."""


def librdkafka_settings(options: Mapping[str, str]) -> dict[str, str]:
    """The `kafka.`-prefixed options of `options` in librdkafka's vocabulary."""
    jvm = {k.removeprefix("kafka."): v for k, v in options.items() if k.startswith("kafka.")}
    settings = {k: v for k, v in jvm.items() if k not in _JVM_ONLY}
    if "sasl.mechanism" in jvm:
        settings["sasl.mechanisms"] = jvm["sasl.mechanism"]
    if "sasl.jaas.config" in jvm:
        found = dict(_JAAS_VALUE.findall(jvm["sasl.jaas.config"]))
        for name in ("username", "password"):
            if name in found:
                settings[f"sasl.{name}"] = found[name].replace('\\"', '"').replace("\\\\", "\\")
    if "ssl.truststore.location" in jvm:
        if jvm.get("ssl.truststore.type", "JKS").upper() != "PEM":
            raise KafkaOptionError(
                "--kafka-option kafka.ssl.truststore.location: the merge lists topics with librdkafka, "
                "which reads only PEM: pass the CA as PEM with kafka.ssl.truststore.type=PEM"
            )
        settings["ssl.ca.location"] = jvm["ssl.truststore.location"]
    return settings


_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# librdkafka-only settings that the JVM client would refuse or misread.
_LIBRDKAFKA_ONLY = {"sasl.mechanisms", "sasl.username", "sasl.password", "ssl.ca.location", "log_level"}


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def jvm_options(settings: Mapping[str, str | int | float | bool]) -> dict[str, str]:
    """librdkafka settings (the worker's `-C`, Dagster's Kafka resource) as Spark Kafka source
    options: `sasl.username`/`sasl.password` as a JAAS line for PLAIN or SCRAM, `ssl.ca.location`
    as a PEM truststore, everything else `kafka.`-prefixed as it is."""
    plain = {k: str(v) for k, v in settings.items() if k != "bootstrap.servers"}
    options = {f"kafka.{k}": v for k, v in plain.items() if k not in _LIBRDKAFKA_ONLY}
    mechanism = plain.get("sasl.mechanisms", plain.get("sasl.mechanism", "")).upper()
    if mechanism:
        options["kafka.sasl.mechanism"] = mechanism
    if "sasl.username" in plain:
        module = _JAAS_MODULES.get(mechanism)
        if module is None:
            raise KafkaOptionError(
                f"sasl.mechanisms={mechanism or '(none)'}: only PLAIN and SCRAM credentials can be passed to "
                "Spark as sasl.username/sasl.password; give it kafka.sasl.jaas.config yourself"
            )
        options["kafka.sasl.jaas.config"] = (
            f"{module} required username={_quoted(plain['sasl.username'])} "
            f"password={_quoted(plain.get('sasl.password', ''))};"
        )
    if "ssl.ca.location" in plain:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = plain["ssl.ca.location"]
    return options
