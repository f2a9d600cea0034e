"""The exit statuses of dew's commands (docs/training.md, "When things go wrong"), shared by the
commands and the launchers that read a job's status, and whether a developer asked for tracebacks
instead of one line."""

from __future__ import annotations

import os

EXIT_BAD_INPUT = 2
"""The config or the command line is wrong; nothing was written."""
EXIT_REFUSED = 3
"""The run directory holds a run with a different config (or an unreadable record); nothing changed."""
EXIT_BUSY = 4
"""Another process holds the run directory (its host and PID are named); nothing changed."""
EXIT_NONFINITE = 5
"""The loss or the gradients became non-finite; the last good checkpoint is named and kept."""
EXIT_NO_INTACT_CHECKPOINT = 6
"""No saved step of the run restores; nothing was moved or deleted."""


def debugging() -> bool:
    """Whether a developer asked for tracebacks (Hydra's switch, or dew's own)."""
    return any(os.environ.get(k, "") not in ("", "0") for k in ("HYDRA_FULL_ERROR", "DEW_DEBUG"))
