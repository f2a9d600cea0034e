"""Checks that run before anything is written: the XLA flags, the checkpoint directory, the kernel.

A bad input must end with one message naming the field, and nothing written. Three inputs would
otherwise fail only once the run directory exists (or kill the process outright):

- ``trainer.xla_flags``: XLA aborts the whole process on a flag it does not know (a fatal log line,
  no Python exception), once the first backend starts. The flags are tried first in a short child
  process that starts only XLA's CPU client (which parses every XLA flag, GPU ones included): about
  1.2 s here, paid once per process and only when ``xla_flags`` is set (docs/training.md).
- ``trainer.checkpoint_dir``: a directory that cannot be created or written (``/proc/x``, a read-only
  mount, another user's folder). Probed by creating and removing a temporary directory in the nearest
  existing ancestor, which is what the run would do (permissions alone miss ``/proc`` for root).
- ``model.attention_impl='cudnn'`` where cuDNN flash attention cannot run (no CUDA GPU, a float32
  model, a head size it does not take): otherwise found only when the step is traced.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from typing import Any

from dew import compat
from dew.contract.config import RunConfig, TrainerConfig
from dew.contract.models import resolve_fields


@functools.cache
def _xla_flags_error(flags: str) -> str | None:
    env = {**os.environ, "XLA_FLAGS": flags, "TF_CPP_MIN_LOG_LEVEL": "0", "JAX_PLATFORMS": "cpu"}
    try:
        child = subprocess.run(
            [sys.executable, "-c", compat.XLA_CPU_CLIENT_CHILD], env=env, capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        return None  # no verdict: the run itself will find out
    if child.returncode == 0:
        return None
    unknown = [
        line.split("XLA_FLAGS:", 1)[1].strip()
        for line in child.stderr.splitlines()
        if "Unknown flag" in line and "XLA_FLAGS:" in line
    ]
    if unknown:
        return f"XLA does not know the flag {unknown[0]}"
    lines = [line for line in child.stderr.splitlines() if line.strip()]
    return "XLA refused them: " + (lines[-1] if lines else f"exit status {child.returncode}")


def check_xla_flags(trainer: TrainerConfig) -> None:
    """Raise naming ``trainer.xla_flags`` if XLA would abort on them (with the environment's
    ``XLA_FLAGS``, which the run appends them to)."""
    if not trainer.xla_flags:
        return
    current = os.environ.get("XLA_FLAGS", "")
    flags = current if trainer.xla_flags in current else f"{current} {trainer.xla_flags}".strip()
    problem = _xla_flags_error(flags)
    if problem:
        where = f" (with XLA_FLAGS={current!r} from the environment)" if current else ""
        raise ValueError(
            f"trainer.xla_flags={trainer.xla_flags!r}{where}: {problem}. XLA's flags are listed in "
            "xla/debug_options_flags.cc; every flag is --name=value"
        )


def check_checkpoint_dir(trainer: TrainerConfig, run_dir: str | os.PathLike) -> None:
    """Raise naming ``trainer.checkpoint_dir`` if the run directory could not be created there."""
    path = os.fspath(run_dir)
    if "://" in path:
        return  # a bucket: orbax and epath report their own errors, and there is nothing to probe cheaply
    where = f"trainer.checkpoint_dir={trainer.checkpoint_dir!r}"
    ancestor = os.path.abspath(path)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise ValueError(
            f"{where}: {ancestor} is a file, not a directory, so the run directory {path} cannot be made under it"
        )
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".dew-probe-", dir=ancestor))
    except OSError as err:
        raise ValueError(
            f"{where}: the run directory {path} cannot be made: {ancestor} takes no new "
            f"directory ({err.strerror}). Choose a writable trainer.checkpoint_dir"
        ) from None


def check_attention(run: RunConfig) -> None:
    """Raise naming ``model.attention_impl`` if it asks for cuDNN where cuDNN cannot run."""
    fields: Any = resolve_fields(run.model.architecture, run.model.fields())
    if getattr(fields, "attention_impl", None) != "cudnn":
        return
    from dew.models.attention import cudnn_obstacles  # heavy: JAX stays out of the launcher's checks

    head_dim = getattr(fields, "head_dim", None) or fields.hidden_size // fields.num_heads
    obstacles = cudnn_obstacles(fields.dtype, head_dim)
    if obstacles:
        raise ValueError(
            f"model.attention_impl='cudnn' cannot run: {'; '.join(obstacles)}. Use "
            "model.attention_impl=auto (cudnn where it can run, xla elsewhere) or xla"
        )
