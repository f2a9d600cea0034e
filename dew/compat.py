"""Every place dew reaches into a library's internals, in one module.

Each of these has no public equivalent in the version dew was written against (``WRITTEN_FOR``);
``tests/test_compat.py`` checks that every one of them is still where dew expects it, so a dependency
update that moves one fails there, loudly and by name, instead of somewhere deep in a run.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

if TYPE_CHECKING:
    import optuna
    from jax._src.lib import xla_client
    from omegaconf import DictConfig
    from submitit.core.job_environment import JobEnvironment
    from submitit.slurm.slurm import SlurmExecutor
    from tyro import _errors

WRITTEN_FOR = {
    "jax": "0.12.0",
    "jaxlib": "0.12.0.1",
    "qwix": "0.1.8",
    "orbax-checkpoint": "0.12.8",
    "hydra-core": "1.3.8",
    "submitit": "1.5.4",
    "optuna": "5.1.0",
    "tyro": "1.0.16",
}
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


class KeyValueStore(Protocol):
    """What dew reads of a JAX process pool's coordination client (jaxlib's
    ``DistributedRuntimeClient``, ``jax_distributed_client``): its key-value store."""

    def key_value_try_get(self, key: str) -> str:
        """``key``'s value; raises (NOT_FOUND) where it is absent."""
        ...

    def key_value_dir_get(self, key: str) -> list[tuple[str, str]]:
        """Every ``(key, value)`` under the prefix ``key``."""
        ...


def key_value_or_none(client: KeyValueStore | None, key: str) -> str | None:
    """``key``'s value in a JAX process pool's key-value store, None where it is absent (the
    client's ``key_value_try_get`` raises NOT_FOUND) or where there is no pool (``client`` None)."""
    if client is None:
        return None
    try:
        return client.key_value_try_get(key)
    except Exception:
        return None


def preemption_notice_in_pool(client: KeyValueStore, count: int) -> tuple[bool, bool]:
    """``(noticed, answered)`` for a pool of ``count`` processes, read from the coordination
    service's key-value store where XLA's preemption sync manager (jaxlib 0.12, the same since
    0.4) keeps them: whether a process's notifier caught a SIGTERM (``RECEIVED_PREEMPTION_NOTICE``,
    then written for every process to see), and whether every process's manager answered it (each
    writes its step counter under ``PREEMPTION_CURRENT_COUNTER/`` and then waits at the pool's
    preemption barrier). A manager shut down before it answered leaves the others at that barrier
    until it times out, 3 minutes, when they leave the pool: checked on a 2-process gloo pool."""
    if key_value_or_none(client, "RECEIVED_PREEMPTION_NOTICE") is None:
        return False, False
    return True, len(client.key_value_dir_get("PREEMPTION_CURRENT_COUNTER/")) >= count


XLA_CPU_CLIENT_CHILD = """
try:
    import jaxlib._jax as xla
    xla.get_tfrt_cpu_client(asynchronous=False)
except ImportError:  # an older jaxlib: start JAX's CPU backend instead
    import jax
    jax.devices("cpu")
"""
"""Python source that starts XLA's CPU client alone, which parses every flag in ``XLA_FLAGS`` (GPU
ones included) and aborts the process on one it does not know: ``dew.training.preflight`` runs it
in a child process. jaxlib 0.12.0.1 exposes the client only as ``jaxlib._jax.get_tfrt_cpu_client``
(no public constructor); where that is missing, starting JAX's CPU backend parses the flags too,
about a second slower."""


# ------------------------------------------------------------------------------------------ qwix


def qwix_flax_util() -> Any:
    """qwix's flax helpers: ``find_param`` (is this operand a parameter of the current module?),
    ``get_current_module`` and ``unbox``, which ``dew.training.adapters.quantization`` needs to tell a weight
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


QT_PROVIDER_PRIVATE = ("_create_dot_general_qt_config", "_create_conv_general_qt_config", "_update_and_get_quant_stat")
"""``qwix.QtProvider``'s private methods its matmuls call; a provider that borrows those matmuls
under another base class (dew's quantized LoRA) must borrow these too."""


def qwix_qt_provider_private() -> dict[str, Callable[..., Any]]:
    """``QT_PROVIDER_PRIVATE`` of ``qwix.QtProvider``, by name."""
    import qwix

    return {name: getattr(qwix.QtProvider, name) for name in QT_PROVIDER_PRIVATE}


def qwix_convert_rules(provider: type[Any], convert: Callable[[Any], Any]) -> None:
    """Make ``provider`` (a subclass of a qwix provider) pass each of its rules through ``convert``
    after its base classes prepared it. qwix 0.1.8's ``QuantizationProvider.__init__`` prepares every
    rule with the private ``self._init_rule(rule)`` (``QtProvider``'s makes it a ``QtRule``), the only
    hook a provider has on its rules; this overrides it on ``provider``."""

    def _init_rule(self: object, rule: object) -> object:
        return convert(super(provider, self)._init_rule(rule))

    provider._init_rule = _init_rule  # a private hook qwix's stubs do not name


# ----------------------------------------------------------------------- dataclasses, cloudpickle


def dataclass_missing_pickles_as_itself() -> None:
    """Make ``dataclasses.MISSING`` pickle as a reference to itself, not as a new instance.

    submitit pickles a job with cloudpickle, which copies a class made at run time (the Hydra
    schema twins of dew.commandline.schema, made by ``dataclasses.make_dataclass``) by value, its
    fields with it. cloudpickle keeps the identity of dataclasses' field-type sentinels (cloudpickle
    PR #513) but not of ``MISSING``: in the job's process a field with a ``default_factory`` then has
    a ``default`` that ``is not MISSING``, OmegaConf takes that copy as the default, and composing
    ``trainer.hooks=[{name: ...}]`` there fails ("Cannot assign _MISSING_TYPE to Dict[str, Any]").
    ``_MISSING_TYPE`` is private to dataclasses; registering its reducer in ``copyreg`` (which
    pickle and cloudpickle both consult) changes nothing else."""
    import copyreg
    import dataclasses

    copyreg.pickle(dataclasses._MISSING_TYPE, _missing_reduced)


def _missing_reduced(_: object) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    import dataclasses

    return getattr, (dataclasses, "MISSING")


# ------------------------------------------------------------------------------- hydra, submitit


def hydra_args_parser() -> Any:
    """Hydra's own command-line parser (overrides, ``-m``, ``--cfg``...), to read a command's
    overrides before Hydra runs it. hydra-core 1.3.8 builds it in ``hydra._internal.utils`` and
    exposes no public way to parse a command line without running the app."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


def hydra_apply_overrides(overrides: list[Any], cfg: DictConfig) -> None:
    """Apply parsed overrides (``key=value``, ``+key=``, ``++key=``, ``~key``) to the ``DictConfig``
    ``cfg`` as Hydra applies a command line's to the config it composed: the same rules (``+`` refuses
    a key that holds a value, ``~`` one that is absent, a plain key must exist where ``cfg`` is in
    struct mode), the same merge of a dict value. hydra-core 1.3.8 does it in the private static
    ``ConfigLoaderImpl._apply_overrides_to_config`` and has no public way to apply overrides to a
    config it did not compose (a run's record)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)


@contextlib.contextmanager
def hydra_reports(report: Callable[[Exception], None]) -> Iterator[None]:
    """Within it, an error that reaches Hydra's own reporting (``hydra.main``'s: a config it cannot
    compose, an exception of the task function) is handed to ``report`` first, which ends the
    process to take it over or returns to leave it to Hydra (its message, exit status 1; with
    ``HYDRA_FULL_ERROR=1`` the traceback). hydra-core 1.3.8 reports through
    ``hydra._internal.utils.run_and_report``, which ``_run_hydra`` looks up at each call, and has no
    public hook for it."""
    from hydra._internal import utils

    original = utils.run_and_report

    def run_and_report(func: Callable[[], object]) -> object:
        def reported() -> object:
            try:
                return func()
            except Exception as err:
                report(err)
                raise

        return original(reported)

    utils.run_and_report = run_and_report
    try:
        yield
    finally:
        utils.run_and_report = original


@contextlib.contextmanager
def hydra_groups_listed_once() -> Iterator[None]:
    """Within it, Hydra's config loader answers every listing of a group's options (what ``--help``
    and ``--hydra-help`` print: each config group and its options) from one copy of its config
    repository per primary config and overrides. hydra-core 1.3.8's ``ConfigLoaderImpl.get_group_options``
    deep-copies the whole repository (every config the ConfigStore holds: dew's schemas, Hydra's,
    the launchers' and sweepers') for each listing, five or so a group: ``dew-train --help`` took
    2.1 CPU-s, ~1.2 of it those copies (py-spy, 2026-12-07). A listing reads the copy (its search
    path set up once, as each copy's is) and never changes it, so one copy gives every listing the
    same answer."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.object_type import ObjectType

    original = ConfigLoaderImpl.get_group_options
    copies: dict[tuple[int, str | None, tuple[str, ...]], Any] = {}

    def get_group_options(
        self: ConfigLoaderImpl,
        group_name: str,
        results_filter: ObjectType | None = ObjectType.CONFIG,
        config_name: str | None = None,
        overrides: list[str] | None = None,
    ) -> list[str]:
        key = (id(self), config_name, tuple(overrides or ()))
        if key not in copies:
            copies[key] = self._parse_overrides_and_create_caching_repo(config_name, list(overrides or ()))[1]
        return copies[key].get_group_options(group_name, results_filter)

    ConfigLoaderImpl.get_group_options = get_group_options  # type: ignore[method-assign]
    try:
        yield
    finally:
        ConfigLoaderImpl.get_group_options = original  # type: ignore[method-assign]


_YAML_PARSED: dict[str | bytes, Any] = {}
"""A YAML text -> what PyYAML parsed it to (``hydra_compositions_read_once``)."""
_hydra_read_once = False
YAML_PARSED_MAX = 2048
"""Texts kept: dew's conf/ holds ~120 files; a process composing thousands of other configs keeps
the first ones."""


def hydra_compositions_read_once() -> None:
    """Make Hydra's compositions cheaper, exactly: in hydra-core
    1.3.8 each composition (``ConfigLoaderImpl.load_configuration``; a command composes twice,
    ``get_mode``'s then the run's, and a launch once more for each job it checks) deep-copies its
    config repository, the ConfigStore singleton with every schema in it, only so that setting the
    copy's search path leaves the original's alone, and parses every YAML file of the defaults list
    again (Hydra's loader is PyYAML's pure-Python one). The copy now shares the store (a deep copy
    whose memo maps the store to itself: what reads it reads a deep copy of the node it loads,
    ``ConfigStore.load``), and ``OmegaConf.load`` parses each distinct text once per process (a
    text maps to one parse; each call gets a config of its own, from a deep copy of it). A
    composition of the digits experiment: 202 -> 148 ms, the composed config the same to the byte
    (bench/compose.py; docs/performance.md, "Composing a config"). Idempotent; each replaced
    function keeps the original as its ``__wrapped__``."""
    import copy
    import os
    import pathlib

    import yaml
    from hydra._internal import config_loader_impl
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf
    from omegaconf._utils import get_yaml_loader

    global _hydra_read_once
    if _hydra_read_once:
        return
    _hydra_read_once = True
    caching = config_loader_impl.CachingConfigRepository

    def __init__(self: Any, delegate: Any) -> None:
        store = ConfigStore.instance()
        self.delegate = copy.deepcopy(delegate, {id(store): store})
        self.cache = {}

    __init__.__wrapped__ = caching.__init__  # type: ignore[attr-defined]
    caching.__init__ = __init__  # type: ignore[method-assign]

    original = OmegaConf.load

    def load(file_: Any) -> Any:
        # OmegaConf.load's body (omegaconf 2.3) with its parse looked up first: a path is opened as
        # it opens it, a stream read from where it stands. A text that fails to parse is handed to
        # the original, so that its error is the original's (naming the same stream).
        if isinstance(file_, (str, pathlib.Path)):
            with open(os.path.abspath(file_), encoding="utf-8") as f:
                text = f.read()
        elif callable(getattr(file_, "seek", None)) and callable(getattr(file_, "tell", None)):
            start = file_.tell()
            text = file_.read()
        else:
            return original(file_)
        if text in _YAML_PARSED:
            obj = _YAML_PARSED[text]
        else:
            try:
                obj = yaml.load(text, Loader=get_yaml_loader())
            except Exception:
                if not isinstance(file_, (str, pathlib.Path)):
                    file_.seek(start)
                return original(file_)
            if len(_YAML_PARSED) < YAML_PARSED_MAX:
                _YAML_PARSED[text] = obj
        if obj is not None and not isinstance(obj, (list, dict, str)):
            raise OSError(f"Invalid loaded object type: {type(obj).__name__}")
        return OmegaConf.create() if obj is None else OmegaConf.create(copy.deepcopy(obj))

    load.__wrapped__ = original  # type: ignore[attr-defined]
    OmegaConf.load = staticmethod(load)  # type: ignore[method-assign]


def hydra_sweep_dir(err: BaseException) -> str | None:
    """The sweep directory of the Hydra sweeper an error was raised through (Hydra's basic sweeper
    writes its ``multirun.yaml`` there before it composes the jobs), None when it came through no
    sweeper. ``Hydra.multirun`` holds its sweeper in a local variable only and sets no
    ``HydraConfig`` before it sweeps (hydra-core 1.3.8): it is found as the ``self`` of a frame of
    the traceback."""
    import traceback

    from hydra.plugins.sweeper import Sweeper

    for frame, _ in traceback.walk_tb(err.__traceback__):
        sweeper = frame.f_locals.get("self")
        if isinstance(sweeper, Sweeper) and (config := getattr(sweeper, "config", None)) is not None:
            sweep_dir = config.hydra.sweep.dir
            return str(sweep_dir) if sweep_dir is not None else None
    return None


def hydra_basic_launcher() -> type:
    """Hydra's basic launcher (a sweep's jobs one after another, in this process), for dew's own to
    derive from. hydra-core 1.3.8 keeps it in the private ``hydra._internal.core_plugins``, which
    its config (``hydra/launcher=basic``) names; there is no public import."""
    from hydra._internal.core_plugins.basic_launcher import BasicLauncher

    return BasicLauncher


def submitit_requeue_signal(environment: type[JobEnvironment] | None = None) -> int:
    """The signal on which submitit's job environment (``environment``, a ``JobEnvironment``
    class; the base one by default) checkpoints and requeues a job: SIGUSR2 unless the job's
    ``SUBMITIT_PREEMPT_SIGNAL`` names another. submitit 1.5.4 reads it only in the private
    ``JobEnvironment._usr_sig()``."""
    from submitit.core.job_environment import JobEnvironment as base

    return (environment or base)._usr_sig()


def submitit_sbatch_script(folder: str, command: str, **parameters: Any) -> str:
    """The batch script submitit's SLURM executor would submit for ``parameters`` (its own
    names: ``job_name``, ``time``, ``ntasks_per_node``, ``mem`` ...), without a cluster: the
    executor itself refuses to start where ``srun`` is missing, and has no public "show me the
    script"."""
    from submitit.slurm import slurm

    return slurm._make_sbatch_string(command=command, folder=folder, **parameters)


@contextlib.contextmanager
def submitit_slurm_script(make: Callable[[str, str, int | None], str]) -> Iterator[None]:
    """Within: submitit's SLURM executor submits the batch script ``make(folder, command,
    map_count)`` returns (the job folder, the command submitit runs in each task, the array's size
    or None), so that the script a dry run prints and the one ``sbatch`` receives come from one
    function. submitit 1.5.4 builds the script in ``SlurmExecutor._make_submission_file_text``
    from its own parameters, where a ``None`` (``wckey``) is dropped and submitit's default
    (``--wckey=submitit``) comes back."""
    from submitit.slurm import slurm

    original = slurm.SlurmExecutor._make_submission_file_text

    def text(self: SlurmExecutor, command: str, uid: str) -> str:
        return make(str(self.folder), command, self.parameters.get("map_count"))

    slurm.SlurmExecutor._make_submission_file_text = text  # type: ignore[method-assign]  # the patch this function is for
    try:
        yield
    finally:
        slurm.SlurmExecutor._make_submission_file_text = original  # type: ignore[method-assign]  # undone


def submitit_slurm_command(folder: str) -> str:
    """The command submitit's SLURM executor runs in each task for the job folder ``folder``
    (``SlurmExecutor._submitit_command_str`` of submitit 1.5.4, which needs an executor, and an
    executor needs ``srun`` on PATH)."""
    import shlex

    return " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(folder)])


def submitit_mem(mem_gb: float) -> str:
    """``mem_gb`` as submitit's SLURM executor writes ``--mem`` (``slurm._convert_mem``)."""
    from submitit.slurm import slurm

    return slurm._convert_mem(mem_gb)


def submitit_slurm_parameter_names() -> dict[str, str]:
    """submitit's generic parameter names (``timeout_min``, ``tasks_per_node`` ...) and the SLURM
    executor's own for each (``time``, ``ntasks_per_node`` ...)."""
    from submitit.slurm import slurm

    return {generic: str(own) for generic, own in slurm.SlurmExecutor._equivalence_dict().items()}


def submitit_requeue() -> int | None:
    """Requeue the submitit job this process runs in, through its job environment's own requeue
    (submitit 1.5.4's private ``JobEnvironment._requeue``: ``scontrol requeue`` for a SLURM job; for
    a local one, ``sys.exit`` with the status its controller requeues on, 144): the status this
    process must exit with for the requeue (the local executor's), None where any will do. Called
    from a thread (dew.training.watchdog), where ``sys.exit`` would end that thread only, so the
    local executor's status is returned instead."""
    import submitit
    from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE

    environment = submitit.JobEnvironment()
    try:
        environment._requeue(countdown=0)
    except SystemExit as requeued:  # the local executor's way
        return int(requeued.code) if isinstance(requeued.code, int) else LOCAL_REQUEUE_RETURN_CODE
    return None


def submitit_requeue_handler(handler: object) -> bool:
    """Whether ``handler`` (a signal handler) is submitit's checkpoint-and-requeue handler (a
    method of submitit 1.5.4's ``SignalHandler``, which submitit installs in every job and does not
    export)."""
    from submitit.core.job_environment import SignalHandler

    return isinstance(getattr(handler, "__self__", None), SignalHandler)


@contextlib.contextmanager
def submitit_local_controllers(started: list[Any]) -> Iterator[None]:
    """Within: submitit's local executor starts each job's controller with SIGINT blocked, so a
    Ctrl-C in the terminal never reaches the controller, whose clean-up (``Controller.run``'s
    ``finally: kill_tasks()``) would send the tasks a second SIGINT and a SIGKILL a second later,
    mid-save; each controller's process is appended to ``started``.

    Blocked, not ignored: the mask is inherited through the controller by its tasks, where a SIGINT
    that comes before the run listens (Python's start, the job's unpickling) stays pending until
    ``dew.training.preemption.install_early`` unblocks it, and is then the run's; and in this
    process a SIGINT that comes while a controller starts is delivered once it has started, not
    lost. submitit 1.5.4's ``LocalExecutor`` calls the module global ``start_controller`` at every
    submission, so this patches that global."""
    import signal

    from submitit.local import local

    original = local.start_controller

    def start_controller(*args: Any, **kwargs: Any) -> Any:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            process = original(*args, **kwargs)
            started.append(process)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        return process

    local.start_controller = start_controller
    try:
        yield
    finally:
        local.start_controller = original


def submitit_job_number(submitted: str) -> int | None:
    """The Hydra job number a submitit job ran, read from its ``<id>_submitted.pkl`` (submitit's
    pickled ``DelayedSubmission``, whose arguments hydra-submitit-launcher 1.2 sets as (overrides,
    the sweep-dir key, the job number, its id, Hydra's singleton state)); None where it cannot be read."""
    from submitit.core.utils import DelayedSubmission

    try:
        number = DelayedSubmission.load(submitted).args[2]
    except Exception:
        return None
    return number if isinstance(number, int) else None


@contextlib.contextmanager
def submitit_local_results_wait(seconds: float) -> Iterator[None]:
    """Within: a local job whose tasks ended without a result (a run stopped by Ctrl-C or SIGTERM
    leaves none: its task exits with 128 + the signal) is reported after ``seconds``, not after
    submitit's 15. submitit 1.5.4 waits ``Job._results_timeout_s`` (a private class attribute, 15 s)
    for the result file of a job that is done, for a network filesystem slow to show it; a local
    job is done once its controller's process ended, which waits for its tasks, each of which wrote
    its result before exiting, on this machine: the file is there or never will be. Measured: a
    Ctrl-C on a 2-task local sweep ended the command 19 s after it, the tasks 1.6 s after it."""
    from submitit.local import local

    had = "_results_timeout_s" in vars(local.LocalJob)
    original = local.LocalJob._results_timeout_s
    local.LocalJob._results_timeout_s = seconds  # type: ignore[assignment]  # the patch this function is for
    try:
        yield
    finally:
        if had:
            local.LocalJob._results_timeout_s = original
        else:
            del local.LocalJob._results_timeout_s


# ---------------------------------------------------------------------------------------- orbax


def _settling_loop_runner(coro: Coroutine[Any, Any, Any]) -> Any:
    """orbax's ``_run_sync_via_new_loop``, except that the loop, before it closes, lets the tasks
    the coroutine left running finish (they end or fail on their own: each is one read)."""
    import asyncio

    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        pending = asyncio.all_tasks(loop)
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        asyncio.set_event_loop(None)
        loop.close()


@contextlib.contextmanager
def orbax_reads_settle() -> Iterator[None]:
    """Within: a restore that fails part-way (a damaged checkpoint) lets its other reads finish
    before orbax closes the event loop they report to.

    orbax-checkpoint 0.12.8 runs each restore with ``asyncio_utils.run_sync``, which (outside a
    running loop) runs the coroutine on a fresh loop (``_run_sync_via_new_loop``) and closes it as
    soon as the coroutine ends. When one array's read fails, the gather over all reads raises at
    once and the loop closes with the other reads still in flight; tensorstore completes them later
    on its own threads, into the closed loop, and Python prints ``RuntimeError: Event loop is
    closed`` as an unraisable exception, once per read. ``run_sync`` reads the module global at
    every call, so the replacement is a patch of that global, restored on exit."""
    from orbax.checkpoint._src import asyncio_utils

    original = asyncio_utils._run_sync_via_new_loop
    asyncio_utils._run_sync_via_new_loop = _settling_loop_runner
    try:
        yield
    finally:
        asyncio_utils._run_sync_via_new_loop = original


REPLICA_SLICE_BYTES = 1 << 20
"""The smallest part of a replicated array a device writes (``orbax_uncompressed_standard_handler``)."""


def orbax_uncompressed_standard_handler() -> Any:
    """orbax's ``StandardCheckpointHandler`` (what ``ocp.args.StandardSave`` and ``StandardRestore``
    run), writing its arrays without compression; its restore is orbax's own, which reads each
    array as its stored metadata says (compressed or not), so checkpoints written either way restore
    alike.

    orbax-checkpoint 0.12.8 offers ``use_compression`` on ``PyTreeCheckpointHandler`` only (zstd,
    level 1, on by default); ``StandardCheckpointHandler`` delegates every save and restore to one
    it builds in ``__init__`` as ``_impl``, with its own defaults and no way to pass that option.
    The replacement is built with those same defaults (read from its signature), compression off,
    and with orbax's type handlers but for ``jax.Array``'s (``orbax_array_handlers``)."""
    import inspect

    import orbax.checkpoint as ocp

    handler = ocp.StandardCheckpointHandler()
    defaults = {name: p.default for name, p in inspect.signature(ocp.StandardCheckpointHandler).parameters.items()}
    handler._impl = ocp.PyTreeCheckpointHandler(
        **defaults, use_compression=False, type_handler_registry=orbax_array_handlers()
    )
    return handler


def orbax_array_handlers() -> Any:
    """orbax's type handlers as registered, but for ``jax.Array``'s: one that splits the writing of
    a replicated array among its replicas (orbax's replica-parallel save, its default on CPUs and
    TPUs) only where each replica's part is at least ``REPLICA_SLICE_BYTES``. orbax splits every
    replicated array, however small, and each part is a slice of a device's buffer: on a run's
    first save, a program compiled for each shape on each device (136 for the tiny DiT on 8 CPU
    devices: 13.0-13.8 CPU-s for that run's process against 8.8 unsplit, 2026-12-07), to write a
    few kilobytes each. Larger arrays are still split as orbax splits them, and a restore reads a
    step written either way.

    The array handler is built as orbax's registry builds its own (with an array metadata store,
    which orbax-checkpoint 0.12.8 exports only from its private modules)."""
    import jax
    from orbax.checkpoint import type_handlers
    from orbax.checkpoint._src.metadata.array_metadata_store import Store

    arrays = type_handlers.ArrayHandler(
        array_metadata_store=Store(), min_slice_bytes_for_replica_parallel=REPLICA_SLICE_BYTES
    )
    return type_handlers.create_type_handler_registry(
        *(
            (ty, arrays if ty is jax.Array else type_handlers.get_type_handler(ty))
            for ty in type_handlers.supported_types()
        )
    )


# ------------------------------------------------------------------------------------------ optuna


def optuna_trial(study: optuna.Study, number: int) -> optuna.trial.Trial:
    """The live ``optuna.trial.Trial`` of ``study`` numbered ``number`` (a trial still running, such
    as one an interrupted command left), to set its attributes before it is told: Optuna maps a
    trial's number to its id only through the storage (as ``Study.tell`` does), and a
    ``FrozenTrial`` keeps its id private. Checked against optuna 5.1.0."""
    import optuna

    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    return optuna.trial.Trial(study, trial_id)


def optuna_set_system_attr(study: optuna.Study, number: int, key: str, value: Any) -> None:
    """Set a system attribute of trial ``number`` of ``study`` (a pruner's own bookkeeping, such as
    successive halving's rungs, that dew replays into the study from a trial's journal). Optuna 3
    removed ``Trial.set_system_attr`` from the public API; its pruners write these through the
    storage, as this does. Checked against optuna 5.1.0."""
    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    study._storage.set_trial_system_attr(trial_id, key, value)


# ------------------------------------------------------------------------------------------- tyro


@contextlib.contextmanager
def tyro_parse_errors(report: Callable[[str], NoReturn]) -> Iterator[None]:
    """Within it, a command line ``tyro.cli`` rejects is handed to ``report`` as one line (the
    option, the value, what it takes) instead of tyro's box of help; ``report`` raises to take over.
    tyro 1.0.16 reports a rejected command line only through ``tyro._errors.on_parse_error``, a hook
    it calls private and experimental; its events carry tyro's internal argument records."""
    from tyro import _errors

    def hook(event: _errors.ParseErrorEvent) -> None:
        report(_tyro_error_line(event))

    with _errors.on_parse_error(hook):
        yield


_TYRO_METAVARS = {"INT": "an integer", "FLOAT": "a number", "{None}": "None", "STR": "a string"}
"""tyro's metavars, as a message names the kinds they stand for."""


def _tyro_error_line(event: _errors.ParseErrorEvent) -> str:
    """One line for a tyro parse-failure event (``tyro._errors``): what was wrong and where."""
    from tyro import _errors

    if isinstance(event, _errors.InvalidChoice):
        return f"{event.argument.display_name()}: {event.value!r} is not one of {', '.join(event.choices)}"
    if isinstance(event, _errors.BadValue):
        name, nargs = event.argument.display_name(), event.argument.lowered.nargs
        if event.offending_value is not None:
            return f"{name} is fixed and takes no value, found {event.offending_value!r}"
        return f"{name}: expects {nargs} value{'' if nargs == 1 else 's'}, found fewer"
    if isinstance(event, _errors.MissingArgs):
        names = [a.arg.display_name() for a in event.missing_arguments]
        return (
            f"missing {', '.join(names)}, which {'has' if len(names) == 1 else 'have'} no default "
            f"(a subcommand's options go after it)"
        )
    if isinstance(event, _errors.MissingSubcommand):
        return f"expected one of {', '.join(event.subcommand_spec.parser_from_name)}"
    if isinstance(event, _errors.UnrecognizedArgs):
        return f"unrecognized {' '.join(event.tokens)} ({event.prog} --help lists the options)"
    if isinstance(event, _errors.InstantiationFailure):
        where = f"{event.argument.display_name()}: " if event.argument is not None else ""
        union = re.match(r"no type matching (\S+) could be instantiated from \[(.*?)\]", event.message)
        if union:  # the reason of each member of the union, one by one, says less than this
            kinds = sorted((_TYRO_METAVARS.get(m, m) for m in union.group(1).split("|")), key=lambda k: k == "None")
            return f"{where}{union.group(2)} is not {' or '.join(kinds)}"
        number = re.match(r"(invalid literal for int\(\)|could not convert string to float).*?: (.*)", event.message)
        if number:
            return f"{where}{number.group(2)} is not {'an integer' if 'int' in number.group(1) else 'a number'}"
        return f"{where}{' '.join(event.message.split())}"
    if isinstance(event, _errors.SubcommandConflict):
        return (
            f"{event.attempted} conflicts with {event.already_selected}, which {event.trigger_flag} chose: "
            f"name the subcommand before the options that belong to it"
        )
    if isinstance(event, _errors.MutexConflict):
        return f"{event.first_token} and {event.second_token} cannot be given together"
    return f"the command line was rejected ({type(event).__name__}; {event.prog} --help lists the options)"


def end_threads() -> None:
    """What Python does first when its program ends (``Py_FinalizeEx``'s wait for the threads, through
    the private ``threading._shutdown``): the threading module's exit hooks (``concurrent.futures``
    tells its idle workers to leave there), then a wait for every non-daemon thread. Joining the
    threads without the hooks waits forever for an executor's idle worker."""
    import threading

    threading._shutdown()  # type: ignore[attr-defined]


def cache_from_every_cpu_process() -> None:
    """Let every process of a CPU pool write JAX's persistent compilation cache, as process 0 does.

    JAX writes cache entries from process 0 alone (``compiler._cache_write``: many processes writing
    the same entries contend on some file systems), which serves a pool where every process computes
    the same key for a program: on GPUs JAX strips the device assignment from the key for that. On
    the CPU it does not, and each process's key names its own devices (the topology fingerprint and
    the compile options differ from one process to the next: checked with jax 0.12 on a 2-process
    gloo pool), so what process 0 wrote is never another process's, and every other process compiled
    every program at every start: a relaunch, a requeue, a resume. Here each CPU process writes its
    own entries, under keys no other process writes (no contention), through the cache's own writer
    and its own rules (the minimum compile time). Idempotent."""
    import warnings

    from jax._src import compilation_cache, compiler, distributed
    from jax._src import config as jax_config

    original = compiler._cache_write
    if getattr(original, "dew_every_cpu_process", False):
        return

    def write(
        cache_key: str,
        compile_time_secs: float,
        module_name: str,
        backend: xla_client.Client,
        executable: xla_client.LoadedExecutable,
    ) -> None:
        if distributed.global_state.process_id == 0 or backend.platform != "cpu":
            original(cache_key, compile_time_secs, module_name, backend, executable)
            return
        if compile_time_secs < jax_config.persistent_cache_min_compile_time_secs.value:
            return
        try:
            compilation_cache.put_executable_and_time(
                cache_key, module_name, executable, backend, int(compile_time_secs)
            )
        except Exception as ex:  # as JAX's own writer: a cache that cannot be written is a warning
            warnings.warn(
                f"Error writing persistent compilation cache entry for '{module_name}': {type(ex).__name__}: {ex}",
                stacklevel=2,
            )

    write.dew_every_cpu_process = True  # type: ignore[attr-defined]
    compiler._cache_write = write
