"""A filesystem whose ``flock`` fails, for a whole Python process: Python imports this module at
start-up when its directory is on ``PYTHONPATH`` (``tests.fs_sim.noflock_env``). Every
``fcntl.flock`` then fails as Lustre mounted without ``-o flock`` answers (ENOSYS), or with the
errno named by ``DEW_SIM_FLOCK_ERRNO`` (ENOLCK: NFS without a lock manager; EOPNOTSUPP). dew's own
code runs unchanged: only the filesystem is simulated."""

import errno
import fcntl
import os

_ERRNO = getattr(errno, os.environ.get("DEW_SIM_FLOCK_ERRNO", "ENOSYS"))


def _flock(fd, operation):  # noqa: ARG001 - fcntl.flock's signature
    raise OSError(_ERRNO, os.strerror(_ERRNO))


fcntl.flock = _flock
