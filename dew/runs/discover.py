"""Finding runs: the run directories under a checkpoint or sweep directory, and each run's journal.

A run directory is one that holds ``run.json``. A directory without one that still looks like a run
(orbax step directories, ``train.log``, a lock file) is reported as damaged rather than skipped: a
user looking for a run should learn that its record is gone. Paths go through epath, so a ``gs://``
sweep is read like a local one.
"""

from __future__ import annotations

import os
import re

from etils import epath

from dew.contract.rundir import JOURNAL, LOCK_FILE, RUN_RECORD, STEP_FINISHED, TRACKING_DIR, is_step

SKIPPED = (TRACKING_DIR, "wandb")
"""Directory names never searched for runs (journals and W&B's files live there, not runs)."""


class RunsError(ValueError):
    """A directory (or option) dew-runs cannot read; the message says why."""


def is_step_dir(path: epath.Path) -> bool:
    """An orbax step directory (``<step>/``); a save still in flight (``<step>.orbax-checkpoint-tmp``)
    is not one."""
    return is_step(path.name)


def checkpoint_steps(run: epath.Path) -> list[int]:
    """The complete checkpoints in a run directory, by step."""
    try:
        return sorted(int(p.name) for p in run.iterdir() if is_step_dir(p) and p.is_dir())
    except OSError:
        return []


def _holds_steps(path: epath.Path, names: set[str]) -> bool:
    """Whether a directory holds orbax step directories: a name of digits with orbax's record in it
    (a sweep's job directories may be named by their number alone)."""
    return any(is_step(n) and (path / n / STEP_FINISHED).exists() for n in names)


def _looks_like_run(path: epath.Path, names: set[str]) -> bool:
    return bool(names & {"train.log", LOCK_FILE, ".hydra"}) or _holds_steps(path, names)


def natural(path: os.PathLike | str) -> list[tuple[int, int | str]]:
    """A path's sort key in the order a person reads it: its runs of digits compared as numbers, so
    that a sweep's jobs come 0, 1, 2, ..., 10, 11 (not 0, 1, 10, 11, 2)."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", os.fspath(path)) if part]


def find_runs(root: str | os.PathLike) -> list[epath.Path]:
    """Every run directory at or under ``root`` (damaged ones included), sorted by path, its numbers
    as numbers (``natural``)."""
    top = epath.Path(root)
    if not top.exists():
        raise RunsError(f"{os.fspath(root)!r} does not exist")
    if not top.is_dir():
        raise RunsError(f"{os.fspath(root)!r} is not a directory (give a run, sweep or checkpoint directory)")
    found: list[epath.Path] = []

    def walk(path: epath.Path) -> None:
        try:
            children = list(path.iterdir())
        except OSError:
            return
        names = {c.name for c in children}
        if RUN_RECORD in names or _looks_like_run(path, names):
            found.append(path)
            return
        for child in sorted(children, key=lambda c: natural(c.name)):
            if child.name.startswith(".") or child.name in SKIPPED or not child.is_dir():
                continue
            walk(child)

    walk(top)
    return sorted(found, key=natural)


def find_journal(run: epath.Path, tracking: str | None = None) -> epath.Path | None:
    """The journal of the run in ``run``, or None when there is none.

    dew writes it to ``<tracking dir>/<name>/journal.jsonl``, where the run directory is
    ``<checkpoint_dir>/<name>`` and the tracking directory is ``tracking`` (or $DEW_TRACKING_DIR) beside
    ``checkpoint_dir``. The record does not say which ancestor of the run directory was
    ``checkpoint_dir`` (a sweep job's name has a slash in it), so each ancestor is tried, nearest
    first.
    """
    tracking = tracking or os.environ.get("DEW_TRACKING_DIR")
    ancestor, parts = run, [run.name]
    for _ in range(8):
        parent = ancestor.parent
        if parent == ancestor:
            break
        folder = epath.Path(tracking) if tracking else parent.parent / TRACKING_DIR
        candidate = folder.joinpath(*parts) / JOURNAL
        if candidate.exists():
            return candidate
        ancestor = parent
        parts = [ancestor.name, *parts]
    return None
