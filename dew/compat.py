"""Every place dew reaches into a library's internals, in one module.

Each of these has no public equivalent in the version dew was written against (``WRITTEN_FOR``);
``tests/test_compat.py`` checks that every one of them is still where dew expects it, so a dependency
update that moves one fails there, loudly and by name, instead of somewhere deep in a run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

WRITTEN_FOR = {"jax": "0.12.0", "qwix": "0.1.8", "submitit": "1.5.4"}
"""The versions whose internals the functions below were written against."""


# ------------------------------------------------------------------------------------------- jax


def jax_backends_started() -> bool:
    """Whether this process already opened a JAX backend (after which XLA flags and
    ``jax_num_cpu_devices`` are ignored). jax has no public query for it."""
    from jax._src import xla_bridge

    return bool(xla_bridge._backends)


def jax_distributed_client() -> Any:
    """The client of the JAX process pool this process joined, or None before
    ``jax.distributed.initialize`` (jax has no public "is initialized" query)."""
    from jax._src import distributed

    return distributed.global_state.client


def jax_preemption_sync_manager() -> Any:
    """The preemption sync manager ``jax.distributed.initialize`` starts (it turns SIGTERM into an
    agreed step: ``multihost_utils.reached_preemption_sync_point``), None outside a pool."""
    from jax._src import distributed

    return distributed.global_state.preemption_sync_manager


# ------------------------------------------------------------------------------------------ qwix


def qwix_flax_util() -> Any:
    """qwix's flax helpers: ``find_param`` (is this operand a parameter of the current module?),
    ``get_current_module`` and ``unbox``, which ``dew.training.quantization`` needs to tell a weight
    from an activation of the same shape."""
    from qwix._src.utils import flax_util

    return flax_util


@contextlib.contextmanager
def qwix_find_param(find_param: Callable[..., str | None]) -> Iterator[None]:
    """Within: qwix asks ``find_param`` instead of its own which operand of a matmul is a weight.
    qwix reads the module global at every call, so the replacement is a patch of that global,
    restored on exit."""
    flax_util = qwix_flax_util()
    original = flax_util.find_param
    flax_util.find_param = find_param
    try:
        yield
    finally:
        flax_util.find_param = original


QT_PROVIDER_PRIVATE = ("_create_dot_general_qt_config", "_create_conv_general_qt_config",
                       "_update_and_get_quant_stat")
"""``qwix.QtProvider``'s private methods its matmuls call; a provider that borrows those matmuls
under another base class (dew's quantized LoRA) must borrow these too."""


def qwix_qt_provider_private() -> dict[str, Callable[..., Any]]:
    """``QT_PROVIDER_PRIVATE`` of ``qwix.QtProvider``, by name."""
    import qwix

    return {name: getattr(qwix.QtProvider, name) for name in QT_PROVIDER_PRIVATE}


# -------------------------------------------------------------------------------------- submitit


def submitit_usr_sig() -> int:
    """The signal submitit's jobs receive before a time limit and on preemption (SIGUSR2 unless
    ``SUBMITIT_PREEMPT_SIGNAL`` says otherwise); submitit has no public accessor for it."""
    from submitit.core.job_environment import JobEnvironment

    return JobEnvironment._usr_sig()


def submitit_requeue_handler(handler: Any) -> bool:
    """Whether ``handler`` (a signal handler) is submitit's checkpoint-and-requeue handler."""
    from submitit.core.job_environment import SignalHandler

    return isinstance(getattr(handler, "__self__", None), SignalHandler)


@contextlib.contextmanager
def submitit_local_controllers(started: list[Any]) -> Iterator[None]:
    """Within: submitit's local executor starts each job's controller with SIGINT ignored (inherited
    by its tasks, whose runs install their own handler), so a Ctrl-C in the terminal reaches the
    tasks, which save and stop, and not the controller, whose clean-up would send them a second
    SIGINT and a SIGKILL a second later; each controller's process is appended to ``started``.
    submitit calls the module global ``start_controller`` at every submission, so this patches it."""
    import signal

    from submitit.local import local

    original = local.start_controller

    def start_controller(*args: Any, **kwargs: Any) -> Any:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            process = original(*args, **kwargs)
        finally:
            signal.signal(signal.SIGINT, previous)
        started.append(process)
        return process

    local.start_controller = start_controller
    try:
        yield
    finally:
        local.start_controller = original
