"""Process set-up before JAX opens a backend: XLA flags, the persistent compilation cache (and its
hits and misses, for the run's report), and the JAX process pool (multi-host), which is
``dew.launching.pool``'s."""

from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import Iterator

from dew import compat
from dew.contract.config import TrainerConfig
from dew.launching.pool import join_process_pool


def prepare_process(trainer: TrainerConfig) -> None:
    """Apply ``xla_flags``, the compilation cache, ``debug_nans`` and ``multi_host`` to this process
    (the training loop holds the NaN checks for its thread: ``nan_checks_held``)."""
    import jax

    if trainer.xla_flags:
        current = os.environ.get("XLA_FLAGS", "")
        if trainer.xla_flags not in current:
            if compat.jax_backends_started():  # a late flag is an error, not ignored
                raise RuntimeError(
                    f"trainer.xla_flags={trainer.xla_flags!r}: JAX already opened a backend in "
                    "this process, so XLA would ignore them; set XLA_FLAGS before starting"
                )
            os.environ["XLA_FLAGS"] = f"{current} {trainer.xla_flags}".strip()
    if trainer.compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", os.path.expanduser(trainer.compilation_cache_dir))
        # Cache every program, however quick to compile: on a restart the step (and evaluation)
        # then loads instead of compiling. The defaults skip programs under 1 s.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        compat.cache_from_every_cpu_process()  # not process 0 alone: a CPU pool's keys differ by process
        _count_cache_events()
    if trainer.debug_nans:  # on for the rest of the process; off, it leaves JAX's settings (JAX_DEBUG_NANS) alone
        # Infinities too: dew's own check stops on either, and an overflow's inf comes a few
        # operations before the NaN (inf - inf, 0 * inf) it turns into.
        jax.config.update("jax_debug_nans", True)
        jax.config.update("jax_debug_infs", True)
    join_process_pool(trainer.multi_host)


@contextlib.contextmanager
def nan_checks_held() -> Iterator[None]:
    """JAX's NaN and infinity checks (``jax_debug_nans``, ``jax_debug_infs``), as this process set
    them, held for this thread: the training loop runs inside.

    Set globally alone (``jax.config.update``), they check a compiled function's outputs on its
    first call only (since jax 0.8; 0.12 too): later calls take the C++ fast path, which checks
    through a post-call hook, and JAX sets that hook to none for the thread whenever it leaves a
    ``with jax.debug_nans(False)`` block entered with no thread-local setting, as JAX itself does
    while tracing through a grad, a scan, a vmap or a remat (``core.jaxpr_as_fun``). Tracing dew's
    train step did, so no step after the first was checked. Inside this block the thread has its own
    setting, which those blocks restore as they leave, hook included."""
    import jax

    with jax.debug_nans(jax.config.jax_debug_nans), jax.debug_infs(jax.config.jax_debug_infs):
        yield


_cache_events: collections.Counter[str] = collections.Counter()
_listening = False


def _count_cache_events() -> None:
    """Count the persistent cache's hits and misses (jax.monitoring events), once per process."""
    global _listening
    if _listening:
        return
    import jax

    def count(event: str, **_: object) -> None:
        if event.startswith("/jax/compilation_cache/cache_"):
            _cache_events[event.rsplit("/", 1)[-1]] += 1

    jax.monitoring.register_event_listener(count)
    _listening = True


def compilation_cache_stats() -> dict[str, int]:
    """Persistent compilation cache hits and misses in this process so far."""
    return {"hits": _cache_events["cache_hits"], "misses": _cache_events["cache_misses"]}
