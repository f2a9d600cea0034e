"""Where a search's Optuna study lives (``hydra/sweeper=optuna``; docs/search.md, "The study lives in
the sweep directory"), and how it is opened by the sweeper, by ``dew-runs`` and by the field's tools.

A study is Optuna's journal file storage, ``<sweep dir>/study.journal`` (``STUDY_FILE``): every change
one JSON line, appended while a lock file made with ``O_CREAT | O_EXCL`` is held (Optuna's
``JournalFileOpenLock``). That lock uses nothing but an atomic create and a rename, which NFS (v3 and
later, with or without a lock manager) and Lustre (with or without ``-o flock``) both give, where
SQLite's ``fcntl`` locks fail; so several processes on several nodes may write one study, and a reader
never needs a lock (a line cut off by a writer is read once it ends). A lock left by a process that
died holding it is broken after ``LOCK_GRACE_S`` without a change.

A study an older dew wrote (optuna 2.10's SQLite, ``study.db``: ``LEGACY_STUDY_FILE``) is continued by
copying it once into the journal (``continue_legacy``): a copy of the file is upgraded to the current
schema with Optuna's own migrations, its study copied trial by trial (states, values, intermediate
values, attributes), and the journal renamed into place whole. The old file is never changed;
``dew-runs`` reads one the same way, from an upgraded copy, until a command continues it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

from dew.contract.rundir import LEGACY_STUDY_FILE, STUDY_FILE

if TYPE_CHECKING:
    import optuna

LOCK_GRACE_S = 30
"""Seconds a journal's lock file may stand unchanged before a writer takes it as left by a dead
process and breaks it (Optuna's default; an append holds it for one write and an ``fsync``)."""


def journal(path: str) -> optuna.storages.JournalStorage:
    """The journal file storage at ``path`` (made if missing), locked without ``flock``."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    return JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path, grace_period=LOCK_GRACE_S)))


def is_url(storage: str) -> bool:
    """Whether ``hydra.sweeper.storage`` names a database (``postgresql://...``, ``sqlite:///...``) rather
    than a journal file."""
    return "://" in storage


def has_study(directory: str) -> bool:
    """Whether sweep ``directory`` holds a study, in either format."""
    return any(os.path.isfile(os.path.join(directory, f)) for f in (STUDY_FILE, LEGACY_STUDY_FILE))


def sweeper_storage(sweep_dir: str, storage: str | None) -> optuna.storages.BaseStorage | str:
    """The storage the sweeper opens for ``hydra.sweeper.storage``: the sweep's own journal when unset
    (continuing an older dew's ``study.db`` first), a database URL as given, or a journal at a path."""
    if storage is None:
        continue_legacy(sweep_dir)
        return journal(os.path.join(sweep_dir, STUDY_FILE))
    if is_url(storage):
        return storage
    return journal(os.path.abspath(os.path.expanduser(storage)))


def continue_legacy(sweep_dir: str) -> bool:
    """Copy the study an older dew left in ``<sweep_dir>/study.db`` into ``<sweep_dir>/study.journal``,
    once (True when it did): nothing is written in place; the journal appears whole or not at all."""
    target = os.path.join(sweep_dir, STUDY_FILE)
    legacy = os.path.join(sweep_dir, LEGACY_STUDY_FILE)
    if os.path.exists(target) or not os.path.isfile(legacy):
        return False
    import optuna

    with upgraded_copy(legacy) as source:
        name = _only_study(source, legacy)
        partial = f"{target}.{os.getpid()}.partial"
        try:
            optuna.copy_study(from_study_name=name, from_storage=source, to_storage=journal(partial))
            os.replace(partial, target)
        finally:
            for leftover in (partial, f"{partial}.lock"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(leftover)
    logging.getLogger("dew").info(
        "study %s: continued from %s (optuna 2.10) in %s; the old file is kept as it was", name, legacy, target
    )
    return True


@contextlib.contextmanager
def upgraded_copy(legacy: str) -> Iterator[optuna.storages.RDBStorage]:
    """The SQLite study ``legacy`` as the current Optuna reads it: a copy, upgraded by Optuna's own
    migrations (alembic), removed after the block. A reader or a command that continues it never
    changes the file itself (a half-upgraded study, or one an older dew cannot read again)."""
    import optuna

    with tempfile.TemporaryDirectory(prefix="dew-study-") as tmp:
        copy = os.path.join(tmp, LEGACY_STUDY_FILE)
        shutil.copyfile(legacy, copy)
        storage = optuna.storages.RDBStorage(f"sqlite:///{copy}", skip_compatibility_check=True)
        try:
            if storage.get_current_version() != storage.get_head_version():
                with _alembic_quiet():
                    storage.upgrade()
            yield storage
        finally:
            storage.remove_session()
            storage.engine.dispose()


def _only_study(storage: optuna.storages.BaseStorage, where: str) -> str:
    """The name of the one study ``storage`` holds (dew keeps one per sweep)."""
    studies = storage.get_all_studies()
    if len(studies) != 1:
        raise ValueError(f"{where} holds {len(studies)} studies; dew keeps one per sweep")
    return studies[0].study_name


@contextlib.contextmanager
def _alembic_quiet() -> Iterator[None]:
    """Optuna's migrations configure Python's logging from alembic's own file (INFO lines on stderr, a
    root handler left behind) when the root logger has no handler: give it one for the upgrade, and
    keep alembic's per-migration INFO lines and Optuna's notes on the old distributions' names out of
    the console."""
    import warnings

    root, alembic = logging.getLogger(), logging.getLogger("alembic")
    placeholder = logging.NullHandler()
    level = alembic.level
    root.addHandler(placeholder)
    alembic.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():  # optuna 2.10's distribution names, read once to be rewritten
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        root.removeHandler(placeholder)
        alembic.setLevel(level)


@contextlib.contextmanager
def reading(directory: str) -> Iterator[optuna.storages.BaseStorage]:
    """The storage of the study in sweep ``directory``, to read: its journal, or an upgraded copy of
    an older dew's ``study.db`` (the file itself untouched)."""
    if os.path.isfile(path := os.path.join(directory, STUDY_FILE)):
        yield journal(path)
        return
    with upgraded_copy(os.path.join(directory, LEGACY_STUDY_FILE)) as storage:
        yield storage


def study_name(storage: optuna.storages.BaseStorage, where: str) -> str:
    """The one study's name (``ValueError`` when ``storage`` holds none or several)."""
    return _only_study(storage, where)
