"""Sizes, rates and durations as people write them, and back: one grammar for each.

``"1.5GB"`` (a memory budget), ``"40ms"`` (a pace), ``"100mbit"`` (a card's
rate, as tc writes it), ``"2ms"`` (a link's delay), and the short forms the
status tables print.  Each parser raises its own field's error in one line
(a memory size :class:`~tfmagic.errors.BadArgument`, a pace
:class:`~tfmagic.errors.BadPace`, a network figure
:class:`~tfmagic.errors.BadNet`; all are ``ValueError``), saying how to write
it.  Kept apart from what uses them so that a size means the same everywhere.

>>> parse_bytes("1.5GB") == 3 * 2**29, parse_seconds("40ms"), parse_rate("100mbit"), parse_delay("2ms")
(True, 0.04, 12500000.0, 0.002)
>>> human_bytes(3 * 2**29), human_bytes(800 * 2**20), human_seconds(125)
('1.50 GB', '800 MB', '2m05s')
>>> parse_delay("50")
Traceback (most recent call last):
...
tfmagic.errors.BadNet: '50' has no unit; write 50ms (or 50s, 50us)
"""

from __future__ import annotations

import math
import re

from .errors import BadArgument, BadNet, BadPace

__all__ = ["human_bytes", "human_seconds", "parse_bytes", "parse_delay", "parse_rate", "parse_seconds"]

_BYTES = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30}
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ms|s|us)?\s*$", re.ASCII)
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)\s*$", re.I | re.A)
_DELAY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ms|s|us)?\s*$", re.I | re.A)
_RATES = {
    "bit": 1 / 8,
    "kbit": 1e3 / 8,
    "mbit": 1e6 / 8,
    "gbit": 1e9 / 8,
    "bps": 1.0,
    "kbps": 1e3,
    "mbps": 1e6,
    "gbps": 1e9,
}


def parse_bytes(value: int | float | str | None) -> int | str:
    """``"1.5GB"`` → bytes; ``None``/``"off"``/``0`` → 0; ``"auto"`` stays ``"auto"``."""
    if value is None:
        return 0
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise BadArgument(f"a memory budget cannot be negative ({value})")
        return int(value)
    text = str(value).strip().lower()
    if text in ("auto", ""):
        return "auto"
    if text in ("off", "none", "0", "false", "no"):
        return 0
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?i?b?)", text)
    if not m:
        raise BadArgument(f"{value!r} is not a memory size; write it like '1.5GB', '800MB', 0 or 'auto'")
    unit = m.group(2).replace("i", "")
    return int(float(m.group(1)) * _BYTES[unit])


def parse_seconds(text: str | float | int) -> float:
    """``"40ms"``, ``"0.04s"``, ``"0.04"`` or ``0.04`` -> 0.04 (seconds); one-line errors."""
    if isinstance(text, bool):
        raise BadPace(f"a pace is a duration such as '40ms', not {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _DURATION.match(str(text))
        if not m:
            raise BadPace(f"{text!r} is not a duration; write it like '40ms' or '0.04s'")
        value = float(m.group(1)) * {"ms": 1e-3, "us": 1e-6, "s": 1.0, None: 1.0}[m.group(2)]
    if not (value > 0 and math.isfinite(value)):
        raise BadPace(f"a pace must be a positive duration such as '40ms', not {text!r}")
    return value


def parse_rate(text: str | float | None) -> float | None:
    """Bytes per second from tc's units: ``100mbit`` (megabits/s), ``5mbps`` (megabytes/s); None: no limit.

    >>> parse_rate("100mbit"), parse_rate("5mbps"), parse_rate(None)
    (12500000.0, 5000000.0, None)
    """
    if text is None or (isinstance(text, str) and text.strip().lower() in ("", "none", "off")):
        return None
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = _finite(text)
        if value is None or not value > 0:
            raise BadNet(f"a rate must be a number of bytes/s > 0, not {_short(text)}")
        return value
    m = _RATE.match(str(text))
    if not m or float(m.group(1)) <= 0:
        raise BadNet(
            f"{text!r} is not a rate; write it as tc does, e.g. 100mbit (megabits/s), 1gbit, or 5mbps (megabytes/s)"
        )
    return float(m.group(1)) * _RATES[m.group(2).lower()]


def parse_delay(text: str | float | None) -> float:
    """Seconds of one-way delay.

    >>> parse_delay("2ms"), parse_delay("0ms"), parse_delay(None), parse_delay(0.5)
    (0.002, 0.0, 0.0, 0.5)
    """
    if text is None:
        return 0.0
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = _finite(text)
        if value is None or not value >= 0:
            raise BadNet(f"a delay must be a number of seconds >= 0, not {_short(text)}")
        return value
    m = _DELAY.match(str(text))
    if not m:
        raise BadNet(f"{text!r} is not a delay; write it like 2ms or 0.5ms (zero or more)")
    if m.group(2) is None and float(m.group(1)) != 0:
        raise BadNet(f"{text!r} has no unit; write {m.group(1)}ms (or {m.group(1)}s, {m.group(1)}us)")
    return float(m.group(1)) * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[(m.group(2) or "s").lower()]


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if unit == "GB" else f"{n / size:.0f} {unit}"
    return f"{n} B"


def human_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _finite(number: float) -> float | None:
    """``number`` as a finite float, or None (an int too big for a float, inf, nan)."""
    try:
        value = float(number)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _short(number: float) -> str:
    text = str(number)
    return text if len(text) <= 24 else f"a number of {len(text)} digits"
