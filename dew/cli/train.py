"""``dew-train``: the single Hydra entry point.

Hydra composes the config from conf/ and the command line; it is converted once into the typed
``Recipe``; the dataset and the objective it names are built; ``RunConfig.train`` runs it. A bad
input ends with one line naming the field, the value and what is allowed, ``EXIT_BAD_INPUT``, and
nothing written (Hydra itself writes nothing: see conf/config.yaml; what Hydra cannot compose is
put in one line by ``dew.commandline.hydra_errors``). A run that stops on its own terms (a refused
resume, a busy run directory, a divergence, no intact checkpoint) ends with ``dew-train: error:
...`` and its own exit status (the ``EXIT_*`` constants; docs/training.md, "When things go
wrong"), no traceback; ``HYDRA_FULL_ERROR=1`` or ``DEW_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import os
import sys

from dew.launching.interrupts import current as launch_interrupts
from dew.launching.interrupts import ends_at_once, install_for_sweep

if __name__ == "__main__" or os.path.basename(sys.argv[0]) == "dew-train":
    install_for_sweep(sys.argv[1:])  # a sweep's launching process takes Ctrl-C from its first moment on

# After the handler: importing the rest (Hydra and dew above all) takes a moment a Ctrl-C can land in.
import contextlib
import datetime
import functools
import logging
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from dew import compat
from dew.build import build_run
from dew.commandline.configs import conf_dir, config_roots, launch_dir, register_configs
from dew.commandline.console import console_script
from dew.commandline.exits import (
    EXIT_BAD_INPUT,
    EXIT_BUSY,
    EXIT_NO_INTACT_CHECKPOINT,
    EXIT_NONFINITE,
    EXIT_REFUSED,
    debugging,
)
from dew.commandline.hydra_errors import composition_error
from dew.commandline.overrides import (
    check_overrides,
    check_unset_records,
    first_job_to_print,
    hydra_form,
    hydra_help_args,
)
from dew.compat import hydra_args_parser as get_args_parser
from dew.contract import journal as journals
from dew.contract.config import RunConfig
from dew.contract.lock import RunLockedError
from dew.contract.objectives import can_sample
from dew.contract.rundir import PRUNED
from dew.contract.typed import ConfigError
from dew.launching.checks import CHECK_FLAG, check_only, check_run, checked, checking, launcher_without_multirun
from dew.launching.naming import SWEEP_ENV
from dew.launching.pool import from_process_zero, joins_a_pool
from dew.launching.search.trial import (
    TrialFailed,
    TrialOutcome,
    check_direction,
    in_a_search,
    search_unavailable,
    selection_value,
)
from dew.launching.stop_exit import exit_after_stop
from dew.launching.sweep_lock import leave_no_trace
from dew.recipe import Recipe
from dew.training.hooks import At, Hook
from dew.training.preemption import Preempted
from dew.training.reporting import trackers
from dew.training.reporting.tracker import tracking_dir
from dew.training.run_directory import RunDirError, refuse_if_held, run_dir, write_hydra_record

if TYPE_CHECKING:
    from etils import epath
    from flax import nnx

    from dew.objectives.base import Objective
    from dew.training.setup import Planned, Setup
    from dew.training.step import TrainState

log = logging.getLogger("dew")

_STAMP = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")


def run_name(recipe: RunConfig) -> str:
    """The run's directory under checkpoint_dir: trainer.name, or the sweep job's, or the time."""
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        return os.path.relpath(hc.runtime.output_dir, recipe.trainer.checkpoint_dir)
    if recipe.trainer.name:
        return recipe.trainer.name
    return f"run-{_STAMP}"


def refuse_a_busy_run_dir(cfg: DictConfig) -> None:
    """Refuse a run directory another process holds, from the composed config, before the typed
    conversion (which imports JAX, seconds on a busy machine): a second writer fails at once. Reads
    only; the run's own lock is taken later, once the config is known to be valid."""
    checkpoint_dir, name = OmegaConf.select(cfg, "trainer.checkpoint_dir"), OmegaConf.select(cfg, "trainer.name")
    if not isinstance(checkpoint_dir, str):
        return
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        refuse_if_held(HydraConfig.get().runtime.output_dir)
    elif isinstance(name, str) and name:
        refuse_if_held(os.path.join(checkpoint_dir, name))


def fail(
    message: str, status: int = EXIT_BAD_INPUT, error: BaseException | None = None, prog: str = "dew-train"
) -> NoReturn:
    """End with one line from ``prog`` on stderr and ``status``; while debugging, re-raise ``error``
    (or the error being handled) so the developer sees the traceback."""
    error = error or sys.exc_info()[1]
    if debugging() and error is not None:
        raise error
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    if in_a_search():  # the sweeper records a failed trial and goes on
        raise TrialFailed(message)
    sys.exit(status)


def stop_status(err: BaseException) -> int | None:
    """The exit status of a run that stopped on its own terms, None for any other error."""
    from dew.training.checkpointing.checkpoints import CheckpointDamagedError  # heavy: orbax and JAX
    from dew.training.early_stopping import EarlyStoppingMetricError
    from dew.training.trainer import NonFiniteError

    statuses = {
        RunLockedError: EXIT_BUSY,
        RunDirError: EXIT_REFUSED,
        NonFiniteError: EXIT_NONFINITE,
        CheckpointDamagedError: EXIT_NO_INTACT_CHECKPOINT,
        EarlyStoppingMetricError: EXIT_BAD_INPUT,
    }
    return next((code for cls, code in statuses.items() if isinstance(err, cls)), None)


def _leave_no_trace() -> None:
    """Remove the job directory Hydra made for a job of a sweep that failed before writing into it."""
    job_dir = Path(HydraConfig.get().runtime.output_dir)
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    # Every process of a job's pool refuses together: another may have removed it (or written into
    # it) since; rank 1's FileNotFoundError here replaced its refusal with a failed JobReturn.
    with contextlib.suppress(OSError):
        if job_dir.is_dir() and not any(job_dir.iterdir()):
            job_dir.rmdir()


class PeerRefused(Exception):
    """Process 0's refusal of the run, in a process of its pool that found nothing wrong: its
    message and exit status."""


def refusal(err: BaseException) -> tuple[str, int] | None:
    """The message and exit status of an error that refuses a run before it trains (a bad input, a
    busy or refused run directory, a peer's refusal), None for any other (a bug: its traceback is
    the report)."""
    if isinstance(err, PeerRefused):
        return err.args[0], err.args[1]
    if isinstance(err, RunLockedError):
        return str(err), EXIT_BUSY
    if isinstance(err, RunDirError):
        return str(err), EXIT_REFUSED
    if isinstance(err, (ConfigError, ValueError, OSError)):  # OSError: missing files, no network
        return str(err), EXIT_BAD_INPUT
    return None


def agree(error: Exception | None) -> None:
    """The set-up's verdict in a pool (``set_up``'s ``agree``): every process asks, process 0
    answers, and a process that is fine stops with process 0's error."""
    mine = refusal(error) if error is not None else None
    if error is not None and mine is None:
        return  # a bug: raised as it is
    message, status = from_process_zero("verdict", list(mine) if mine else [None, EXIT_BAD_INPUT])
    if mine is None and message:
        raise PeerRefused(message, status)


def plan(recipe: RunConfig, container: Any) -> Planned:
    """What the run trains, once the process pool is up (``set_up``'s ``plan``): one run however
    many processes. Each resolved its own config and name (a time stamp can differ by a second), so
    all take process 0's; a busy run directory is refused at once, before the data loads."""
    from dew.training.setup import Planned  # heavy: JAX loads once the config is valid

    theirs, name = from_process_zero("run", [container, run_name(recipe)])
    if theirs != container:  # converted once, unless process 0 composed another config
        recipe = Recipe.from_dict(theirs)
    refuse_if_held(run_dir(recipe, name))
    run, objective, dataset = build_run(recipe)
    return Planned(run, objective, dataset, name)


def train_from_hydra(cfg: DictConfig) -> str | TrialOutcome | None:
    """Convert the composed config once, build what it names, set the run up and train. Returns
    what Hydra hands its sweeper and callbacks (``JobReturn.return_value``): in a search, the
    trial's outcome (process 0's); otherwise the run directory. Never the trained state: a
    launcher's task pickles what it returns into ``.submitit/`` for the launching process, which
    would write every parameter and moment once per task, make the launching process load JAX to
    read them back (1-2 s a launch), and fail at the end of any run whose parameters are split
    across processes (a ``jax.Array`` that spans other processes' devices cannot be pickled): the
    state is in the run's checkpoints."""
    from dew.training.setup import set_up  # heavy: JAX loads once the config is valid

    held = contextlib.ExitStack()  # the lock and the signal handlers, to the end of the run
    try:
        refuse_a_busy_run_dir(cfg)
        container = OmegaConf.to_container(cfg, resolve=True)
        recipe: RunConfig = Recipe.from_dict(container)
        if checking():
            check_single_run(recipe)
            return None
        planned, setup = set_up(recipe.trainer, held, functools.partial(plan, recipe, container), agree=agree)
    except Exception as err:
        refused = refusal(err)
        if refused is None:
            raise
        held.close()
        _leave_no_trace()
        fail(*refused, error=None if isinstance(err, PeerRefused) else err)
    import jax

    is_main = jax.process_index() == 0
    recipe, objective, _, name = planned  # process 0's
    hooks = trial_hooks(recipe, objective, name, setup.total_steps, is_main)
    train_set_up(planned, setup, held, hooks=hooks, hydra_cfg=cfg)
    if not in_a_search():
        return os.fspath(setup.path)
    return reported_value(recipe, objective, name) if is_main else None  # the launcher reads process 0's


def train_set_up(
    planned: Planned,
    setup: Setup,
    held: contextlib.ExitStack,
    *,
    hooks: Sequence[Hook] = (),
    hydra_cfg: DictConfig | None = None,
    prog: str = "dew-train",
) -> TrainState:
    """Train the run ``set_up`` set up (its lock and signal handlers in ``held``, released at the
    end), write its samples and say where it is: ``dew-train``'s end of a run and ``dew-recipe``'s.
    A stop on a signal ends the process with the signal's status, a stop on the run's own terms with
    one line from ``prog`` and its status. ``hydra_cfg``: Hydra's composed config, whose record
    (``.hydra/``) process 0 writes first, and whose job directory a failed sweep job leaves behind
    empty is removed."""
    import jax

    from dew.objectives.metrics import builtin_metrics  # heavy: JAX loads once the config is valid
    from dew.training.trainer import train

    run, objective, dataset, name = planned
    final = FinalSamples(objective, setup.path, run.trainer.seed, prog)
    drawn = [final] if run.trainer.final_samples else []  # trainer.final_samples=false: none
    try:
        with held:
            if hydra_cfg is not None and jax.process_index() == 0:
                write_hydra_record(setup.path, hydra_cfg)
            state = train(
                run,
                objective,
                dataset,
                name=name,
                metrics=builtin_metrics(objective),
                summary=objective.summary(),
                setup=setup,
                hooks=[*hooks, *drawn],
            )
            if drawn and not final.drawn:  # a run stopped early, or one that had ended already: after its end
                write_samples(objective, state, setup.path, seed=run.trainer.seed, prog=prog)
    except Preempted as stopped:
        line = stopped_line(stopped, run.trainer.name, name, prog=prog, hydra=hydra_cfg is not None)
        print(f"{prog}: run {name!r}: {line}", file=sys.stderr, flush=True)
        exit_after_stop(stopped.signum, reason=stopped.reason)
    except Exception as err:
        status = stop_status(err)
        if status is None:
            raise  # anything else is a bug: its traceback is the report
        if hydra_cfg is not None:
            _leave_no_trace()
        fail(str(err), status, prog=prog)
    if jax.process_index() == 0:
        went = trackers.destinations(run.trainer, name, tracking_dir(run.trainer) / name)
        print(f"{prog}: run {name!r} is in {setup.path}{''.join(f'; {w}' for w in went)}", flush=True)
    return state


TYPED: list[str] = []
"""``dew-train``'s arguments as they were typed: ``main`` records them before it rewrites them for
Hydra. Empty in another command (``dew-recipe``), whose ``sys.argv`` is as typed."""


def stopped_line(stopped: Preempted, trainer_name: str | None, name: str, *, prog: str, hydra: bool) -> str:
    """What a run stopped on a signal ends with: ``Preempted``'s line, which says that the same command
    resumes the run. That is true where the command names the run (``trainer.name``, or a sweep's
    job); a run without a name is named after the moment it started, so the same command would
    start another: the line then gives the command that resumes it, this one with the run's name."""
    said = str(stopped)
    if trainer_name or (hydra and HydraConfig.get().mode == RunMode.MULTIRUN):
        return said
    named = f"trainer.name={name}" if hydra else f"--trainer.name {shlex.quote(name)}"
    return f"{said.rsplit('; ', 1)[0]}; resume it with: {shlex.join([prog, *(TYPED or sys.argv[1:])])} {named}"


def check_single_run(recipe: RunConfig, path: str | None = None, prog: str = "dew-train") -> None:
    """``dew-train --check`` (``dew-recipe --check``) on one run: every check the run makes before
    it writes anything (``dew.launching.checks.check_run``), over the devices it would train on
    here, and one line. ``path`` is the run directory (dew-train's: ``run_name`` of Hydra's job)."""
    path = path or os.fspath(run_dir(recipe, run_name(recipe)))
    devices = None
    if not joins_a_pool(recipe.trainer.multi_host):  # this process alone: its own devices
        import dataclasses

        from dew.training.setup import start_process  # heavy: JAX, for this process's devices

        start_process(dataclasses.replace(recipe.trainer, multi_host=False))  # the run's flags, as it sets them
        import jax

        devices = jax.device_count()
    check_run(recipe, path, devices)
    print(
        f"{prog}: check: the run passes every check a launch makes; nothing was written (its directory "
        f"would be {path})",
        flush=True,
    )


def reported_value(recipe: RunConfig, objective: Objective, name: str) -> TrialOutcome:
    """What the task function returns to Hydra's sweeper: the run's selection value, and whether its
    pruner stopped it (dew.launching.search.trial)."""
    from dew.objectives.metrics import builtin_metrics  # heavy: JAX (a search's trial reports its value)
    from dew.training.trainer import best_criterion

    metric, higher_is_better = best_criterion(builtin_metrics(objective))
    check_direction(metric, higher_is_better)
    journal = tracking_dir(recipe.trainer) / name / "journal.jsonl"
    early = journals.read(journal).early_stop()
    return TrialOutcome(
        selection_value(journal, metric, higher_is_better),
        os.fspath(journal),
        metric,
        pruned=early is not None and early.get("reason") == PRUNED,
    )


def trial_hooks(recipe: RunConfig, objective: Objective, name: str, total_steps: int, is_main: bool) -> list[Hook]:
    """A search's trial's pruning (``hydra.sweeper.pruner``: dew.launching.search.pruning), or nothing."""
    if not in_a_search() or (spec := HydraConfig.get().sweeper.get("pruner")) is None:
        return []
    from dew.launching.search.pruning import Judge, Prune  # heavy: Optuna, in a search's trial with a pruner
    from dew.objectives.metrics import builtin_metrics  # heavy: JAX (loaded by now: the run is set up)
    from dew.training.trainer import best_criterion

    metric, higher_is_better = best_criterion(builtin_metrics(objective))
    hc = HydraConfig.get()
    judge = Judge(
        make_pruner=instantiate(spec),
        study_name=hc.sweeper.get("study_name") or Path(hc.sweep.dir).name,
        number=int(hc.job.num),
        sweep_tracking=(tracking_dir(recipe.trainer) / name).parent,
        metric=metric,
        direction="maximize" if higher_is_better else "minimize",
    )
    return [Prune(judge, total_steps, is_main)]


class FinalSamples(Hook):
    """The samples of the trained model (``write_samples``), drawn at the run's last step, before
    its ``end`` event: the run report times them (its ``samples`` phase), and the goodput ledger
    counts them in the run's wall time."""

    phase = "samples"
    after_checkpoint = True  # the last checkpoint is saved before the samples are drawn

    def __init__(self, objective: Objective, run_path: epath.Path, seed: int, prog: str) -> None:
        super().__init__(every=None)  # at the last step only
        self.objective, self.run_path, self.seed, self.prog = objective, run_path, seed, prog
        self.drawn = False

    def on_step(self, at: At) -> None:
        write_samples(self.objective, at.state, self.run_path, seed=self.seed, prog=self.prog)
        self.drawn = True


def write_samples(
    objective: Objective, state: TrainState, run_path: epath.Path, *, seed: int, prog: str = "dew-train"
) -> None:
    """Samples of the trained model in the run directory, for objectives that draw them, and one line
    from ``prog`` naming them. Every process takes part in gathering a model split over processes;
    process 0 samples alone."""
    if not can_sample(objective):
        return
    import jax

    from dew.sampling import write_sample_grid, write_text_samples  # heavy: JAX

    model = state.model(ema=state.ema is not None)
    if jax.process_count() > 1:
        model = _gathered(model)
    if jax.process_index() == 0:
        write = write_sample_grid if hasattr(objective, "sample_grid") else write_text_samples
        samples = write(objective, model, run_path, seed=seed)
        print(f"{prog}: samples in {samples}", flush=True)


def _gathered(model: nnx.Module) -> nnx.Module:
    """``model`` with every array whole in this process (a collective: every process calls it), so
    that one process can sample from it alone."""
    import jax
    from flax import nnx
    from jax.experimental import multihost_utils

    graphdef, state = nnx.split(model)
    state = jax.tree.map(
        lambda x: multihost_utils.process_allgather(x, tiled=True) if isinstance(x, jax.Array) else x, state
    )
    return nnx.merge(graphdef, state)


def report_hydra_error(err: Exception) -> None:
    """End with one line and ``EXIT_BAD_INPUT`` for a config Hydra could not compose from the
    command line (``dew.commandline.hydra_errors``), a sweep's directory left as it was before (Hydra's
    sweeper writes its ``multirun.yaml`` before it composes the jobs); any other error is left to
    Hydra to report."""
    if (message := composition_error(err, config_roots())) is None:
        return
    if (sweep_dir := compat.hydra_sweep_dir(err)) is not None:
        leave_no_trace(sweep_dir)
    fail(message, error=err)


def for_printing(argv: list[str]) -> None:
    """``argv`` rewritten in place for the commands that print instead of training. ``--hydra-help``
    takes dew's template (conf/hydra/hydra_help/dew.yaml) and finds the launcher profiles: Hydra
    composes it from its own config alone, without conf/config.yaml's choices and search path.
    ``-m`` with ``--cfg`` or ``--info`` prints the sweep's first job (``first_job_to_print``), which
    is named on stderr (stdout stays the config alone). ``--help`` shows the config resolved, as
    the run reads it (an unset record ``null``, not the ``${unset:}`` the schema holds it by)."""
    if "--hydra-help" in argv:
        argv[1:] = hydra_help_args(argv[1:], Path(launch_dir()).as_uri())
    if "--help" in argv and "--resolve" not in argv:
        argv.insert(argv.index("--help") + 1, "--resolve")
    try:
        argv[1:], note = first_job_to_print(argv[1:])
    except ValueError as err:
        fail(str(err))
    if note:
        print(f"dew-train: {note}", file=sys.stderr)


@console_script  # outside: it ends the process with the status ends_at_once gives
@ends_at_once
def main() -> None:
    os.environ.pop(SWEEP_ENV, None)  # a new command starts a new sweep
    TYPED[:] = sys.argv[1:]
    if CHECK_FLAG in sys.argv[1:]:
        sys.argv.remove(CHECK_FLAG)
        check_only()
    sys.argv[1:] = hydra_form(sys.argv[1:], Recipe)  # model.config='{"depth": 4}', model.config.mup=true
    for_printing(sys.argv)  # --hydra-help; -m with --cfg or --info
    register_configs()

    try:
        args, unknown = get_args_parser().parse_known_args()
    except SystemExit:
        args, unknown = None, []  # Hydra reports its own usage errors
    if flags := [a for a in unknown if a.startswith("-")]:
        fail(f"unrecognized {' '.join(flags)} (dew-train --help lists the flags)")
    if unknown:
        fail(
            f"{' '.join(unknown)}: an override after a flag; the flags (-m, --cfg, --check, ...) go before "
            "the overrides"
        )
    overrides = args.overrides if args else []

    if problem := (
        search_unavailable(overrides)
        or check_overrides(overrides, Recipe)
        or (args and launcher_without_multirun(args))
        or check_unset_records(overrides, Recipe, conf_dir())
    ):
        fail(problem)
    try:
        listing = args is not None and (args.help or args.hydra_help)  # the config groups, printed
        with (
            compat.hydra_reports(report_hydra_error),
            compat.hydra_groups_listed_once() if listing else contextlib.nullcontext(),
        ):
            hydra.main(version_base="1.3", config_path=conf_dir(), config_name="config")(train_from_hydra)()
    except KeyboardInterrupt:  # Ctrl-C twice on a run alone (dew.training.preemption), a basic sweep's job
        if debugging():
            raise
        print("dew-train: interrupted", file=sys.stderr)
        sys.exit(130)
    if (signals := launch_interrupts()) is not None and signals.received is not None:
        sys.exit(signals.status)  # a sweep's Ctrl-C that came after its jobs ended
    if checking() and args and args.multirun and not (args.cfg or args.info or args.help or args.hydra_help):
        count = checked()
        print(
            f"dew-train: check: {count} job{'s' if count != 1 else ''} pass every check a launch makes "
            f"(for a search: its first trials); nothing was started or written",
            flush=True,
        )


if __name__ == "__main__":
    main()
