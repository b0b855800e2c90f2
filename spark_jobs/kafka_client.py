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


class KafkaOptionError(ValueError):
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
