"""The run directory: one run is one directory, ``<trainer.checkpoint_dir>/<name>/``.

It holds ``run.json`` (the resolved config), the orbax step directories, Hydra's ``.hydra/`` and
``train.log``. Starting a run whose directory already holds a record resumes it when the config is
the same and is refused, with the fields that differ, when it is not: nothing is overwritten.

One process writes a run directory at a time: process 0 of the run holds its lock
(``dew.training.lock``) from before it writes anything there until the run ends, and a second
writer is refused at once with the holder's host and PID.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

from etils import epath

from dew.config import RUN_RECORD, RunConfig
from dew.training.lock import RunLock, RunLockedError, describe, holder


class RunDirError(ValueError):
    """A run directory that cannot take this run."""


def run_dir(config: RunConfig, name: str) -> epath.Path:
    """``checkpoint_dir/name``; a name that would escape checkpoint_dir is refused."""
    root = os.path.abspath(config.trainer.checkpoint_dir)
    path = os.path.abspath(os.path.join(root, name))
    if os.path.commonpath([root, path]) != root or path == root:
        raise RunDirError(f"run name {name!r} escapes trainer.checkpoint_dir={config.trainer.checkpoint_dir!r}")
    return epath.Path(path)


def differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted paths where two JSON records differ, with both values."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in old or key not in new:
                out.append(f"{path}: {'missing' if key not in old else old[key]!r} -> "
                           f"{'missing' if key not in new else new[key]!r}")
            else:
                out.extend(differences(old[key], new[key], path))
        return out
    return [] if old == new else [f"{prefix}: {old!r} -> {new!r}"]


def prepare_run_dir(config: RunConfig, name: str, *, write: bool = True) -> epath.Path:
    """Check the run directory can take ``config`` and write the record there (before anything
    trains). The same config again is a resume; a different one is refused, nothing overwritten."""
    path = run_dir(config, name)
    record = path / RUN_RECORD
    if record.exists():
        try:
            old = json.loads(record.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise RunDirError(f"{record}: unreadable run record ({err}); refusing to touch the run") from None
        diff = differences(old, config.to_dict())
        if diff:
            raise RunDirError(
                f"{path} already holds a run with a different config; nothing was changed. Fields that "
                "differ (recorded -> requested):\n  " + "\n  ".join(diff)
                + "\nResume it with the recorded config, or name a new run with trainer.name=...")
        return path
    if write:
        config.save(os.fspath(path))
    return path


_held: dict[str, int] = {}
"""Run directories this process holds the lock of, and how many ``hold`` blocks hold each: dew-train
takes the lock before it writes the record and ``RunConfig.train`` takes it again, and a second
``flock`` from the same process would be refused by the first."""


@contextlib.contextmanager
def hold(path: str | os.PathLike) -> Iterator[None]:
    """Hold ``path``'s run-directory lock for the block (once per process however deeply nested);
    raises ``RunLockedError`` naming the holder when another process has it."""
    key = os.path.abspath(os.fspath(path)) if "://" not in os.fspath(path) else os.fspath(path)
    if key in _held:
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    lock = RunLock(path).acquire()
    _held[key] = 1
    try:
        yield
    finally:
        del _held[key]
        lock.release()


def refuse_if_held(path: str | os.PathLike) -> None:
    """Raise ``RunLockedError`` if another live process holds ``path`` (reads only: it takes and
    writes nothing, so it can run before a config is fully checked)."""
    key = os.path.abspath(os.fspath(path)) if "://" not in os.fspath(path) else os.fspath(path)
    if key in _held:
        return
    who = holder(path)
    if who is not None:
        raise RunLockedError(f"{key} is in use by {describe(who)}; a run directory takes one writer "
                             "at a time. Wait for it to finish or stop it, or name another run with "
                             "trainer.name=...")


def write_hydra_record(path: epath.Path, cfg: Any) -> None:
    """Write Hydra's record of the job (config, hydra config, overrides) to ``<run>/.hydra/``.

    Hydra is told to write nothing itself (conf/config.yaml) so that a bad input leaves no trace;
    this writes what it would have, once the run is known to be valid.
    """
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hc = HydraConfig.get()
    folder = path / ".hydra"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (folder / "hydra.yaml").write_text(OmegaConf.to_yaml({"hydra": hc}))
    (folder / "overrides.yaml").write_text(OmegaConf.to_yaml(list(hc.overrides.task)))
