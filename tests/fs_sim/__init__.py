"""Simulated filesystems for tests of code that runs in subprocesses (dew-train, the SLURM
stand-in's tasks): each is a directory with a ``sitecustomize.py`` that Python imports at start-up
when the directory is on ``PYTHONPATH``."""

from __future__ import annotations

import os
from pathlib import Path

NOFLOCK = Path(__file__).parent / "noflock"
"""``sitecustomize.py`` making every ``fcntl.flock`` fail (see its docstring)."""


def noflock_env(env: dict[str, str], errno_name: str = "ENOSYS") -> dict[str, str]:
    """A copy of ``env`` whose Python processes run on a filesystem where ``flock`` fails with
    ``errno_name`` (ENOSYS: Lustre without ``-o flock``; ENOLCK: NFS without a lock manager)."""
    path = [str(NOFLOCK), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {**env, "PYTHONPATH": os.pathsep.join(path), "DEW_SIM_FLOCK_ERRNO": errno_name}
