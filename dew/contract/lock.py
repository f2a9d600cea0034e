"""The run-directory lock: one writer per run directory, on every filesystem clusters use.

Two kinds, one file, ``<run dir>/.lock``:

* **flock**, where the filesystem supports it (local disks, NFS with a lock manager, Lustre mounted
  with ``-o flock``, GPFS): an OS file lock held for as long as the writing process lives. The
  kernel releases it when that process dies, however it dies (SIGKILL, power loss), so no stale
  lock blocks the resume that follows; the file itself stays and only names the last holder. On
  NFS the lock lives on the server: a client that dies for good (never reboots to tell the server's
  lock manager) can leave its lock held until the server drops it (NFSv4: its lease, ~90 s; NFSv3:
  when ``statd`` learns of the client's reboot, or an administrator clears it). dew relies on that,
  with one exception: the file records the holder's SLURM job id, and a requeue of that same job
  (which SLURM starts only after ending the job's processes) sets the locked file aside and locks a
  new one. Anyone else is refused, naming the host that held it.
* **a lease**, where ``flock`` fails with ENOSYS (Lustre without ``-o flock``), ENOLCK (NFS without
  a lock manager), EOPNOTSUPP or any other error but "held": the file holds the holder's host, PID,
  SLURM job id and a heartbeat time that a daemon thread renews every ``STALE_S / 6`` seconds by
  writing a new file and renaming it over the old one. It needs nothing from the filesystem but an
  atomic hard link, rename and unlink. It is taken by hard-linking a complete file to ``.lock``
  (which fails if one exists); a lease that is not live any more is removed under
  ``.lock.takeover`` (created the same way, so takers judge and remove one at a time: two that
  interleaved could remove the lease one of them had just linked), after checking ``.lock`` still
  holds the lease judged, and the new one linked in its place. A lease is not
  live once released (marked so by its holder on exit), when its heartbeat is older than its bound
  (``STALE_S``, or ``DEW_LEASE_STALE_S`` in the holder's environment), when it was held on this host
  by a process that no longer exists, or, for a writer, when it was held by an earlier run of this
  same SLURM job (a requeue). A takeover of a lease someone held says so in the log.

A second writer fails at once with the holder's host and PID. Readers (``dew-sample``, ``dew-runs``)
never take the lock; ``holder`` asks whether a live process holds it without disturbing that
process, for either kind.

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
import threading
import time
import uuid
from typing import Any

from dew.contract.rundir import LOCK_FILE

log = logging.getLogger("dew")

STALE_S = 60.0
"""Seconds after its last heartbeat that a lease counts as abandoned (its holder renews it six times
as often). It must exceed the clock skew between the cluster's nodes and the longest stall of the
holder's process; ``STALE_ENV`` in the holder's environment overrides it for that lease."""

STALE_ENV = "DEW_LEASE_STALE_S"

TAKEOVER_STALE_S = 10.0
"""Seconds after which a takeover file (``.lock.takeover``, held for the milliseconds a taker needs
to judge and remove a lease that is not live) counts as left by a taker that died."""

RENEWALS_PER_BOUND = 6
"""Heartbeats per stale bound: a holder misses five in a row before its lease can be taken."""

HELD = (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN)
"""What ``flock`` answers when another process holds the lock; any other error means the
filesystem cannot lock (ENOSYS, ENOLCK, EOPNOTSUPP, ...) and the lease takes over."""


class RunLockedError(RuntimeError):
    """The run directory is held by another live process."""


def _local(directory: str | os.PathLike) -> str | None:
    text = os.fspath(directory)
    return None if "://" in text else text


def _parse(data: bytes) -> dict[str, Any]:
    try:
        text = data.decode("utf-8", "replace")
        record = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return _parse(os.read(fd, 4096))
    except OSError:
        return {}


def _read_file(path: str) -> tuple[dict[str, Any], bytes] | None:
    """The record in ``path`` and its bytes, or None when there is no such file."""
    try:
        with open(path, "rb") as f:
            data = f.read(4096)
    except FileNotFoundError:
        return None
    return _parse(data), data


def describe(holder: dict[str, Any]) -> str:
    """``process 1234 on host-a (since 2026-11-30 12:00:00)``, from what the holder wrote."""
    since = holder.get("started")
    when = f" (since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))})" if since else ""
    job = f" in SLURM job {holder['slurm_job_id']}" if holder.get("slurm_job_id") else ""
    return f"process {holder.get('pid', '?')} on {holder.get('host', '?')}{job}{when}"


def stale_after() -> float:
    """This process's lease bound in seconds: ``DEW_LEASE_STALE_S`` if set to a positive number."""
    text = os.environ.get(STALE_ENV)
    if text is None:
        return STALE_S
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if value > 0:
        return value
    log.warning("%s=%r is not a positive number of seconds: using %s", STALE_ENV, text, STALE_S)
    return STALE_S


def _gone(record: dict[str, Any]) -> bool:
    """Whether the lease's holder was a process on this host that no longer exists."""
    pid = record.get("pid")
    if record.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _own_earlier_run(record: dict[str, Any]) -> bool:
    """Whether ``record`` was written by another process of this process's own SLURM job: the
    job's run before a requeue (SLURM ends a job's processes before it requeues the job)."""
    job = os.environ.get("SLURM_JOB_ID")
    me = (socket.gethostname(), os.getpid())
    return bool(job) and str(record.get("slurm_job_id")) == job and (record.get("host"), record.get("pid")) != me


def not_live(record: dict[str, Any], *, writer: bool) -> str | None:
    """Why a lock file's ``record`` does not hold the run directory ("" when it never held anything
    worth a word: no lease, a released one), or None when it is a live lease. ``writer``: asked by a
    process about to take it, for which an earlier run of its own SLURM job does not count."""
    if not isinstance(record.get("heartbeat"), (int, float)) or record.get("released"):
        return ""
    if writer and _own_earlier_run(record):
        return f"it was held by an earlier run of this SLURM job ({record['slurm_job_id']}), now requeued"
    if _gone(record):
        return f"its holder, process {record.get('pid')} on this host, is gone"
    bound = record.get("stale_after")
    bound = bound if isinstance(bound, (int, float)) and bound > 0 else STALE_S
    age = time.time() - float(record["heartbeat"])
    if age > bound:
        return f"its last heartbeat is {age:.0f} s old (a lease is stale after {bound:g} s, {STALE_ENV})"
    return None


def _busy(local: str, holder: dict[str, Any]) -> RunLockedError:
    return RunLockedError(
        f"{local} is in use by {describe(holder)}; a run directory takes one writer at a "
        "time. Wait for it to finish or stop it, or name another run with trainer.name=..."
    )


class _Lease:
    """The lock where ``flock`` does not work: ``.lock`` as a lease its holder's thread renews."""

    def __init__(self, local: str) -> None:
        self.local = local
        self.path = os.path.join(local, LOCK_FILE)
        self.bound = stale_after()
        self.record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.time(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "lease": uuid.uuid4().hex,
            "stale_after": self.bound,
            "heartbeat": time.time(),
        }
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _staged(self, **changes: object) -> str:
        """A complete copy of the record (with ``changes``) beside the lock file, to link or rename."""
        self.record.update(changes)
        temp = f"{self.path}.{self.record['lease']}.{time.monotonic_ns()}"
        with open(temp, "w") as f:
            json.dump(self.record, f)
            f.flush()
            os.fsync(f.fileno())
        return temp

    def _create(self) -> bool:
        """Link a complete lease to ``.lock`` if there is none: True if this took it."""
        temp = self._staged(heartbeat=time.time())
        try:
            return _link_new(temp, self.path)
        finally:
            os.unlink(temp)

    def _remove(self, judged: bytes) -> bool:
        """Remove ``.lock`` if it still holds ``judged``: True if removed (or gone already), False if
        it changed or another taker is at work (read it again). One taker at a time, under the
        takeover file: judging and removing must not interleave with another taker's, or one could
        remove the lease another had just taken in the stale one's place."""
        if not self._begin_takeover():
            return False
        try:
            found = _read_file(self.path)
            if found is None:
                return True
            if found[1] != judged:  # renewed or taken since it was read
                return False
            os.unlink(self.path)
            return True
        finally:
            os.unlink(self._takeover_path)

    @property
    def _takeover_path(self) -> str:
        return f"{self.path}.takeover"

    def _begin_takeover(self) -> bool:
        """Create the takeover file (True), or wait a moment while another taker holds it (False).
        One left by a taker that died (older than ``TAKEOVER_STALE_S``, by the time it holds) is removed."""
        temp = self._staged(heartbeat=time.time())
        try:
            if _link_new(temp, self._takeover_path):
                return True
        finally:
            os.unlink(temp)
        found = _read_file_quietly(self._takeover_path)
        since = found[0].get("heartbeat") if found else None
        if isinstance(since, (int, float)) and time.time() - since > TAKEOVER_STALE_S:
            log.warning("%s: removing the takeover file a process left %.0f s ago", self.local, time.time() - since)
            _set_aside(self._takeover_path, f"{self._takeover_path}.{self.record['lease']}.aside")
        time.sleep(0.01)
        return False

    def acquire(self) -> None:
        """Take the lease or raise ``RunLockedError`` naming its live holder."""
        deadline = time.monotonic() + 3 * TAKEOVER_STALE_S  # past a takeover file a dead taker left
        displaced: tuple[str, str] | None = None
        while time.monotonic() < deadline:
            if self._create():
                if displaced:  # said by the process that took its place only
                    log.warning("%s: taking over the run lock of %s: %s", self.local, *displaced)
                self._start()
                return
            found = _read_file(self.path)
            if found is None:
                continue
            record, data = found
            reason = not_live(record, writer=True)
            if reason is None:
                raise _busy(self.local, record)
            if self._remove(data) and reason:
                displaced = (describe(record), reason)
        raise RunLockedError(f"{self.local}: could not take the run lock: other processes keep taking it")

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._renew, name="dew-lease", daemon=True)
        self._thread.start()

    def _mine(self) -> bool:
        found = _read_file(self.path)
        return found is not None and found[0].get("lease") == self.record["lease"]

    def _renew(self) -> None:
        """Renew the heartbeat until released; stop (saying so) if another process took the lease."""
        while not self._stop.wait(self.bound / RENEWALS_PER_BOUND):
            try:
                if not self._mine():
                    log.error("%s: this process lost its run lock (another process took it over)", self.local)
                    return
                os.replace(self._staged(heartbeat=time.time()), self.path)
            except OSError as err:  # a filesystem hiccup: the next heartbeat tries again
                log.warning("%s: could not renew the run lock: %s", self.local, err)

    def release(self) -> None:
        """Stop renewing and mark the lease released (it stays, naming its last holder)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            if self._mine():
                os.replace(self._staged(released=time.time()), self.path)
        except OSError as err:
            log.warning("%s: could not release the run lock (it goes stale in %g s): %s", self.local, self.bound, err)


class RunLock:
    """An exclusive lock on one run directory, for the process that writes it."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = directory
        self._fd: int | None = None
        self._lease: _Lease | None = None

    def acquire(self) -> RunLock:
        """Take the lock, or raise ``RunLockedError`` naming the process that holds it."""
        local = _local(self.directory)
        if local is None:
            log.warning(
                "%s is not on a local filesystem: the run directory is not locked against a second writer",
                self.directory,
            )
            return self
        os.makedirs(local, exist_ok=True)
        self._take(local, requeued=False)
        return self

    def _take(self, local: str, *, requeued: bool) -> None:
        """flock ``.lock``, or take a lease where the filesystem cannot; ``requeued``: the file an
        earlier run of this SLURM job still locked has just been set aside."""
        path = os.path.join(local, LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _read_holder(fd)
            os.close(fd)
            if err.errno in HELD and not requeued and _own_earlier_run(holder):
                # NFS can keep a dead node's flock: the requeued job moves that file aside and locks anew
                log.warning(
                    "%s: taking over the run lock of %s: it was held by an earlier run of this SLURM "
                    "job, now requeued, whose flock outlived it",
                    local,
                    describe(holder),
                )
                _set_aside(path, f"{path}.{uuid.uuid4().hex}.aside")
                self._take(local, requeued=True)
                return
            if err.errno in HELD:
                raise _busy(local, holder) from None
            log.info(
                "%s: the filesystem cannot flock (%s): the run lock is a lease renewed every %g s",
                local,
                errno.errorcode.get(err.errno or -1, err.errno),
                stale_after() / RENEWALS_PER_BOUND,
            )
            self._lease = _Lease(local)
            self._lease.acquire()
            return
        self._claim(fd, local)

    def _claim(self, fd: int, local: str) -> None:
        """Write this process into the flocked file, unless it holds a live lease (a process on a
        node that cannot flock the same directory)."""
        found = _read_holder(fd)
        if not_live(found, writer=True) is None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise _busy(local, found)
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        if os.environ.get("SLURM_JOB_ID"):  # a requeue of the job may take over (see _take)
            record["slurm_job_id"] = os.environ["SLURM_JOB_ID"]
        os.write(fd, json.dumps(record).encode())
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder(directory: str | os.PathLike, *, writer: bool = False) -> dict[str, Any] | None:
    """What the live process holding ``directory``'s lock wrote (host, pid, started; a lease adds
    its SLURM job and heartbeat), or None when no process holds it (never locked, finished, died,
    or a lease gone stale). Takes nothing: a shared flock tried and dropped at once, or the lease
    read. ``writer``: asked by a process about to take the lock (see ``not_live``)."""
    local = _local(directory)
    if local is None:
        return None
    path = os.path.join(local, LOCK_FILE)
    found = _read_file_quietly(path)
    if found is None:
        return None
    if isinstance(found[0].get("heartbeat"), (int, float)):
        return found[0] if not_live(found[0], writer=writer) is None else None
    held = _flock_holder(path)
    return None if held is not None and writer and _own_earlier_run(held) else held


def _link_new(temp: str, path: str) -> bool:
    """Make ``path`` a hard link to the complete file ``temp`` unless ``path`` exists: True if this
    call made it."""
    try:
        os.link(temp, path)
    except FileExistsError:
        pass  # on NFS possibly a retransmitted link that did succeed: the link count tells
    except OSError:  # a filesystem without hard links: create-exclusive, then write
        return _create_exclusive(path, temp)
    return os.stat(temp).st_nlink == 2  # open(2)'s NFS-safe test: the link is ours


def _create_exclusive(path: str, temp: str) -> bool:
    """Create ``path`` holding ``temp``'s bytes if it does not exist (where hard links fail)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with open(temp, "rb") as f, os.fdopen(fd, "wb") as out:
        out.write(f.read())
        out.flush()
        os.fsync(out.fileno())
    return True


def _set_aside(path: str, aside: str) -> None:
    """Remove ``path`` by renaming it first (a file another client still locks or reads goes at once)."""
    try:
        os.rename(path, aside)
        os.unlink(aside)
    except FileNotFoundError:
        pass


def _read_file_quietly(path: str) -> tuple[dict[str, Any], bytes] | None:
    try:
        return _read_file(path)
    except OSError:
        return None


def _flock_holder(path: str) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as err:  # held, or a filesystem that cannot flock (then nobody holds it so)
            return (_read_holder(fd) or {"host": "?", "pid": "?"}) if err.errno in HELD else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
