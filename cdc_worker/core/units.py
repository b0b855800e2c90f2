"""Sizes and durations as an engineer reads them. Pure."""

from __future__ import annotations

KIB = 1024
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n: int) -> str:
    """`512 B`, `50.0 KiB`, `43.2 MiB`: binary units, one decimal, so that 50 KB never reads 0."""
    value = float(n)
    for unit in _UNITS:
        if abs(value) < KIB or unit == _UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= KIB
    raise AssertionError("unreachable")


def human_seconds(seconds: float) -> str:
    """`42 s`, `5 min 3 s`, `2 h 10 min`."""
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"
