"""The run-directory lock: one writer per run directory.

An OS file lock (``fcntl.flock``) on ``<run dir>/.lock``, held for as long as the writing process
lives. The kernel releases it when that process dies, however it dies (SIGKILL, power loss), so no
stale lock can block the resume that follows; the file itself stays and only names the last holder.
A second writer fails at once with the holder's host and PID. Readers (``dew-sample``, ``dew-runs``)
never take it; ``holder`` asks whether a live process holds it without disturbing that process.

Only local run directories can be locked (a ``gs://`` bucket has no file locks): there ``RunLock``
holds nothing and says so once in the log.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from typing import Any

from dew.rundir_format import LOCK_FILE

log = logging.getLogger("dew")


class RunLockedError(RuntimeError):
    """The run directory is held by another live process."""


def _local(directory: str | os.PathLike) -> str | None:
    text = os.fspath(directory)
    return None if "://" in text else text


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 4096).decode("utf-8", "replace")
        return json.loads(data) if data.strip() else {}
    except (OSError, ValueError):
        return {}


def describe(holder: dict[str, Any]) -> str:
    """``process 1234 on host-a (since 2026-11-30 12:00:00)``, from what the holder wrote."""
    since = holder.get("started")
    when = f" (since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))})" if since else ""
    return f"process {holder.get('pid', '?')} on {holder.get('host', '?')}{when}"


class RunLock:
    """An exclusive lock on one run directory, for the process that writes it."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = directory
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock, or raise ``RunLockedError`` naming the process that holds it."""
        local = _local(self.directory)
        if local is None:
            log.warning("%s is not on a local filesystem: the run directory is not locked against a "
                        "second writer", self.directory)
            return self
        os.makedirs(local, exist_ok=True)
        fd = os.open(os.path.join(local, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _read_holder(fd)
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                raise
            raise RunLockedError(f"{local} is in use by {describe(holder)}; a run directory takes one "
                                 "writer at a time. Wait for it to finish or stop it, or name another run "
                                 "with trainer.name=...") from None
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                 "started": time.time()}).encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder(directory: str | os.PathLike) -> dict[str, Any] | None:
    """What the live process holding ``directory``'s lock wrote (host, pid, started), or None when
    no process holds it (never locked, finished, or died). Takes nothing: a shared lock tried and
    dropped at once."""
    local = _local(directory)
    if local is None:
        return None
    try:
        fd = os.open(os.path.join(local, LOCK_FILE), os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _read_holder(fd) or {"host": "?", "pid": "?"}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
