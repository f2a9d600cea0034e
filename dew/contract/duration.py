"""Wall-clock durations as a person writes them: ``trainer.max_time``'s values.

Three spellings, the ones the tools around a run already use: a number of seconds (``5400``,
``90.5``); numbers with units, largest first (``90m``, ``1.5h``, ``2d``, ``1h30m``: ``s``, ``m``,
``h``, ``d``); and clock notation, Lightning's ``DD:HH:MM:SS`` (``00:12:00:00``) or ``HH:MM:SS``
(``12:00:00``, SLURM's ``--time`` without days). Two fields (``12:00``) are refused: they read as
minutes and seconds to SLURM and as hours and minutes to a person.
"""

from __future__ import annotations

import math
import re

UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
"""Seconds in each unit a duration may name."""

_WITH_UNITS = re.compile(r"(?:(\d+(?:\.\d+)?)([dhms]))")
_CLOCK_FIELDS = {3: (3600.0, 60.0, 1.0), 4: (86400.0, 3600.0, 60.0, 1.0)}

SPELLINGS = "seconds (5400), a number with units (90m, 1.5h, 2d, 1h30m) or DD:HH:MM:SS / HH:MM:SS"
"""What a duration may be, for the messages that refuse one."""


def seconds(value: str | float, field: str) -> float:
    """``value`` in seconds, positive and finite; a ``ValueError`` naming ``field`` otherwise."""
    text = str(value).strip().lower()
    total = _parse(text)
    if total is None or not math.isfinite(total) or total <= 0:
        raise ValueError(f"{field}={value!r} is not a positive duration: give {SPELLINGS}")
    return total


def _parse(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        pass
    if ":" in text:
        parts = text.split(":")
        weights = _CLOCK_FIELDS.get(len(parts))
        if weights is None or not all(p.isdigit() for p in parts):
            return None
        return sum(int(p) * w for p, w in zip(parts, weights, strict=True))
    found = _WITH_UNITS.findall(text)
    if not found or "".join(n + u for n, u in found) != text:
        return None
    units = [u for _, u in found]
    if units != sorted(set(units), key=list(UNITS).index):  # each unit once, largest first
        return None
    return sum(float(n) * UNITS[u] for n, u in found)
