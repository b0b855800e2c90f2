"""Remembered JVM names: py4j's Java packages, classes and static methods resolved once per process.

PySpark reaches the JVM through py4j names: `F.col` is `jvm.org.apache.spark.sql.functions.col`,
a list of columns passes through `jvm.PythonUtils.toSeq`. py4j resolves every such name anew on every
use, one round trip per dotted part, and the JVM answers a part that is not a class (`org`,
`PythonUtils` before the imports are tried) by looking for it in every jar of its classpath. A
table's frame of a consistent read makes about 1,700 of these calls; in a profile of reading 50
tables, a fifth of the JVM's time went to finding the same names again.

A package, a class or a static method of a running JVM never changes, so `remember()` keeps each
one in the Python object that resolved it: the next use is an attribute read, no round trip. A
static field's value may change, so it is resolved every time, as are names that do not resolve.
`remember()` changes py4j's proxies for the whole process (`spark_session.build_session` calls it)
and is idempotent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_REMEMBERING: set[type] = set()  # the proxies whose lookups remember already


def remember() -> None:
    """Resolve each JVM package, class and static method once per proxy (see the module's text)."""
    from py4j.java_gateway import JavaClass, JavaMember, JavaPackage, JVMView

    for proxy in (JVMView, JavaPackage, JavaClass):
        if proxy not in _REMEMBERING:
            proxy.__getattr__ = _remembering(proxy.__getattr__, (JavaPackage, JavaClass, JavaMember))
            _REMEMBERING.add(proxy)


def _remembering(original: Callable[[Any, str], Any], stable: tuple[type, ...]) -> Callable[[Any, str], Any]:
    def resolve(proxy: Any, name: str) -> Any:
        value = original(proxy, name)
        # Python looks in the instance before calling __getattr__: the next use is a plain read.
        if isinstance(value, stable):
            object.__setattr__(proxy, name, value)
        return value

    return resolve
