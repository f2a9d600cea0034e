"""A sweep's directory and its jobs' directories, and the sweep record that carries them from the
process that starts the sweep to every job (Hydra's ``hydra.sweep.dir`` and ``hydra.sweep.subdir``
resolve through ``${dew_sweep:...}`` and ``${dew_job:...}``, conf/config.yaml)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

SWEEP_ENV = "DEW_SWEEP"
"""The environment variable that carries a sweep's directory name and swept keys from the process
that starts the sweep to every job (the basic launcher's, in the same process, and submitit's, in
processes that inherit the environment), so that all agree on one directory."""

FIXED_KEYS = ("trainer.name", "trainer.checkpoint_dir", "experiment")
"""Overrides a job directory's name leaves out when no sweep record says which keys were swept."""

JOB_NAME_MAX = 120
"""Longest job directory name (most filesystems take 255 bytes per path component)."""


def sweep_name(name: str | None, checkpoint_dir: str, overrides: Iterable[object] = ()) -> str:
    """A sweep's directory under checkpoint_dir: ``<name>-sweep-<digest>`` (``sweep-<digest>`` for an
    unnamed run), the digest that of the sweep's command line. The same command launched again finds
    the same directory, resumes its unfinished jobs and leaves its finished ones as they are (a time
    stamp would start the sweep over); a different command gets another. It is never a run
    directory, so a sweep over a named experiment does not write into the run that name holds.

    Resolved first in the process that starts the sweep, where ``overrides`` are the command line's
    own (``optim.learning_rate=1e-3,3e-3``); that process records the name and the swept keys in
    $DEW_SWEEP for every job (``job_dirname``).
    """
    if known := os.environ.get(SWEEP_ENV):
        return json.loads(known)["dir"]
    command = sorted(str(o) for o in overrides)
    digest = hashlib.sha1("\n".join(command).encode()).hexdigest()[:10]
    candidate = f"{name}-sweep-{digest}" if name else f"sweep-{digest}"
    parts = Path(candidate).parts
    for depth in range(1, len(parts) + 1):  # a name like a/b puts the sweep inside run a
        inside = os.path.join(checkpoint_dir, *parts[:depth])
        if os.path.exists(os.path.join(inside, "run.json")):
            raise ValueError(
                f"trainer.name={name!r}: the sweep's directory {candidate!r} would lie inside the run "
                f"{inside}; a sweep never writes into a run directory: name it elsewhere"
            )
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([str(o) for o in overrides])
    swept = [o.key_or_group for o in parsed if o.is_sweep_override()]
    os.environ[SWEEP_ENV] = json.dumps({"dir": candidate, "swept": swept})
    return candidate


def sweep_record(config: DictConfig) -> str | None:
    """The sweep's record (its directory and swept keys) as ``sweep_name`` decides it in the
    launching process: the launchers pickle it with every job, so a job that does not inherit the
    environment (``--export=NONE``) agrees with the launching process. None for a sweep directory
    given on the command line (``hydra.sweep.dir=...``), which every job composes alike."""
    str(config.hydra.sweep.dir)  # resolving the directory records the sweep
    return os.environ.get(SWEEP_ENV)


def job_dirname(num: int | str, overrides: Iterable[object], sweep_dir: str | None = None) -> str:
    """A sweep job's directory: its number (unique in the sweep), then the swept keys with this
    job's values, short enough to read in a listing: each key by its last part, or as many parts as
    tell it from another swept key (``optim.learning_rate`` is ``learning_rate``), and a number with
    more digits than a person reads at 4 significant ones (a sampler's ``0.0012345678901`` is
    ``0.001235``), made safe as one path component: ``3-learning_rate=0.001235,warmup_steps=600``.
    The number keeps two jobs apart; each job's exact overrides are in its ``.hydra/overrides.yaml``
    and ``run.json``, which ``dew-runs`` reads. Fixed overrides are left out, so every job's name
    shows what tells it apart. Without a sweep record, every override but ``FIXED_KEYS``.

    A sweep an older dew started (its jobs named by the whole keys and values, ``0-optim.learning_rate
    =0.0012345678901``) and the same command continues keeps its jobs' directories: the older name,
    where ``sweep_dir`` holds it and not the new one."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    known = os.environ.get(SWEEP_ENV)
    swept = set(json.loads(known)["swept"]) if known else None
    parsed = OverridesParser.create().parse_overrides([str(o) for o in overrides])
    pairs = sorted(
        (o.key_or_group, o.get_value_element_as_str())
        for o in parsed
        if (o.key_or_group in swept if swept is not None else o.key_or_group not in FIXED_KEYS)
    )
    short = short_keys([k for k, _ in pairs])
    name = _named(num, ",".join(f"{short[k]}={compact(v)}" for k, v in pairs))
    if sweep_dir is not None and not os.path.exists(os.path.join(sweep_dir, name)):
        older = _named(num, ",".join(f"{k}={v}" for k, v in pairs))
        if os.path.exists(os.path.join(sweep_dir, older)):
            return older
    return name


def _named(num: int | str, text: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.,=+-]", "_", text)
    if len(safe) > JOB_NAME_MAX:  # keep the start readable; the hash keeps two long names apart
        safe = f"{safe[: JOB_NAME_MAX - 9]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return f"{num}-{safe}" if safe else str(num)


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each key's shortest dotted suffix (a group's ``optim/schedule`` by its last part too) that no
    other key in ``keys`` ends with."""
    out = {}
    for key in keys:
        parts = re.split(r"[./]", key)
        for n in range(1, len(parts) + 1):
            suffix = parts[-n:]
            if not any(re.split(r"[./]", other)[-n:] == suffix for other in keys if other != key):
                break
        out[key] = key[len(key) - len(".".join(suffix)) :]
    return out


def compact(value: str) -> str:
    """A value as a job's name shows it: a float with more than 4 significant digits at 4
    (``0.0012345678`` as ``0.001235``, ``3.14159e-05`` as ``3.142e-05``), anything else (an integer
    too: a step count is exact) as given."""
    if re.fullmatch(r"[+-]?\d+", value):
        return value
    try:
        number = float(value)
    except ValueError:
        return value
    digits = re.sub(r"[eE].*$", "", value).lstrip("+-").replace(".", "").lstrip("0")
    if len(digits) <= 4 or not math.isfinite(number):
        return value
    return f"{number:.4g}"


class SweepInPickle:
    """The sweep's record (``SWEEP_ENV``: its directory and swept keys), taken in the launching
    process and set again in each job's process from the pickle: a launcher mixin for submitit's
    launchers, whose jobs run in other processes."""

    config: Any
    sweep: str | None = None

    def record_sweep(self) -> None:
        self.sweep = sweep_record(self.config)

    def restore_sweep(self) -> None:
        if self.sweep is not None:
            os.environ[SWEEP_ENV] = self.sweep
