"""A finished run rebuilt from its directory, for dew-sample and dew-export.

The run's ``run.json`` is read back as a ``Recipe`` (``dew.contract.config.RunRecord``); the dataset, the
resolved model fields and the objective are rebuilt through ``dew.build`` (the path ``dew-train``
built them through), and the model's parameters (and their EMA) are restored from the chosen checkpoint
(``Checkpoints.restore_part``), without the optimizer state. A damaged checkpoint is reported with its
step and what is wrong, and the newest intact step before it is read instead
(``Checkpoints.first_intact``, the walk a resume takes). Nothing here writes: no lock, no move.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence

import jax
from etils import epath
from flax import nnx

import dew
from dew.build import build_run
from dew.commandline.configs import conf_dir
from dew.contract.config import NoRunRecord, RunRecord
from dew.contract.data import Dataset
from dew.contract.rundir import RUN_RECORD, TOKENIZER_DIR
from dew.contract.typed import ConfigError, differences
from dew.data.tokenizer import saved_record
from dew.data.tokenizer_identity import identity
from dew.inference import composing
from dew.objectives.base import Objective
from dew.objectives.metrics import builtin_metrics
from dew.recipe import Recipe
from dew.training import adapt
from dew.training.adapters.merge import merged_model
from dew.training.checkpointing import warmstart
from dew.training.checkpointing.checkpoints import CheckpointDamagedError, Checkpoints
from dew.training.evaluate import best_criterion
from dew.training.setup import start_process


class SampleError(Exception):
    """A run directory (or an option) that cannot be sampled from; the message says why."""


@dataclasses.dataclass
class Restored:
    """A run rebuilt from its directory: the record, the objective, the dataset and the model."""

    recipe: Recipe
    objective: Objective
    dataset: Dataset
    model: nnx.Module
    step: int
    ema: bool
    """Whether ``model`` carries the EMA of the parameters."""
    params: nnx.State
    """The restored parameters the model was merged with."""
    damaged: tuple[tuple[int, str], ...] = ()
    """Damaged steps passed over on the way to ``step``: (step, what is wrong)."""


# ------------------------------------------------------------------------------ the run directory


def load_recipe(run_dir: str, overrides: Sequence[str] = (), prog: str = "dew-sample") -> Recipe:
    """The run's record (``RunRecord``) as a ``Recipe``, with the command line's ``overrides`` applied
    as dew-train applies them (``dew.inference.composing``), or a SampleError that says what is wrong with
    the directory or the overrides."""
    if not os.path.isdir(run_dir):
        raise SampleError(f"run directory {run_dir!r} does not exist")
    try:
        recorded = RunRecord.read(run_dir).typed(Recipe)
    except NoRunRecord as err:
        raise SampleError(str(err)) from None
    except (ConfigError, ValueError, TypeError) as err:
        raise SampleError(
            f"cannot read the run record: {err}. Was the run written by a different "
            f"dew version? This is dew {dew.__version__}."
        ) from None
    if not overrides:
        return recorded
    try:
        return composing.on_record(
            os.path.abspath(run_dir), composing.read_overrides(overrides, prog), conf_dir(), prog
        )[0]
    except composing.EvalError as err:
        raise SampleError(str(err)) from None


def run_checkpoints(recipe: Recipe, objective: Objective, run_dir: str) -> Checkpoints:
    """The checkpoints of the run in ``run_dir``, their best chosen as the run chose it: by the value
    ``trainer.evals.best`` names (a task's, a held-out source's, a built-in metric's: higher is
    better where it is for that value), else by ``eval/loss``. (A Python metric marked ``best`` that
    a script passed to ``Recipe.train`` is not in the record: the best is then by ``eval/loss``.)"""
    metric, higher = best_criterion(builtin_metrics(objective), recipe.trainer.evals)
    return Checkpoints(
        epath.Path(os.path.abspath(run_dir)), keep=recipe.trainer.keep, best_metric=metric, higher_is_better=higher
    )


def choose_step(checkpoints: Checkpoints, run_dir: str, *, step: int | None, latest: bool) -> int:
    steps = checkpoints.all_steps()
    if not steps:
        raise SampleError(
            f"{run_dir!r} holds no finished checkpoint: the run has not saved one yet, or stopped before its first save"
        )
    if step is not None:
        if step not in steps:
            raise SampleError(f"--step {step}: {run_dir!r} holds steps {', '.join(map(str, sorted(steps)))}")
        return step
    newest = checkpoints.latest_step()
    assert newest is not None  # the run holds steps
    if latest:
        return newest
    best = checkpoints.best_step()
    return best if best is not None else newest


def rebuild(recipe: Recipe, record: str, recorded: Recipe | None = None) -> tuple[Objective, Dataset]:
    """(objective, dataset) built from the record as dew-train built them; refused when the data no
    longer gives the model the run was trained with, or when the command line's overrides (which
    made ``recipe`` of the ``recorded`` one) give another model than its checkpoints hold."""
    try:
        resolved, objective, dataset = build_run(recipe)
    except (ValueError, FileNotFoundError) as err:
        raise SampleError(f"cannot rebuild the run from {record}: {err}") from None
    if recorded is None and resolved.to_dict() != recipe.to_dict():
        diff = differences(recipe.to_dict(), resolved.to_dict())
        raise SampleError(
            "the data no longer gives the model the run was trained with (recorded -> now):\n  " + "\n  ".join(diff)
        )
    if recorded is not None and (diff := differences(_shape(recorded), _shape(resolved))):
        raise SampleError(
            f"the checkpoints hold the model the run recorded; the overrides give another (recorded -> now): "
            f"{'; '.join(diff)}"
        )
    return objective, dataset


def _shape(recipe: Recipe) -> dict[str, object]:
    """What of a run's model its parameters' shapes follow from: the architecture and its fields."""
    model = recipe.to_dict()["model"]
    return {"model": {"architecture": model["architecture"], "config": model["config"]}}


def recorded_tokenizer(objective: Objective, run_dir: str) -> Objective:
    """``objective`` decoding with the tokenizer the run recorded in its directory (``TOKENIZER_DIR``)
    where it kept one: the one it trained on, even if the source it was read from changed since."""
    record = saved_record(os.path.join(run_dir, TOKENIZER_DIR))
    if record is None or not dataclasses.is_dataclass(objective) or not hasattr(objective, "tokenizer"):
        return objective
    return dataclasses.replace(objective, tokenizer=record)


def refuse_other_tokenizer(
    trained_on: Mapping[str, object] | None, dataset: Dataset, data: object, model: str, reuse: str
) -> None:
    """Refuse ``dataset`` (loaded from the spec ``data``) when its tokenizer is not the one the model
    was trained on (``trained_on``, a tokenizer record: the run's ``TOKENIZER_DIR``, a Hugging Face
    directory's ``tokenizer.json``), identified by content (``dew.data.tokenizer_identity``): its ids
    mean other text, and any loss on them means nothing. The vocabulary size is no test of that (a
    padded model has rows past its data's ids). ``model`` names the model in the message, ``reuse``
    is what ``dew-prepare --tokenizer`` takes to encode with the model's tokenizer. Data that records
    no tokenizer (a raw file, an older sidecar), or a model that recorded none (an older run), is not
    checked here: its vocabulary alone is."""
    given = getattr(dataset, "tokenizer", None)
    if not isinstance(given, Mapping) or trained_on is None:
        return
    want, got = identity(trained_on), identity(given)
    if want == got:
        return
    fields = [f"data.{f}={v!r}" for f in ("path", "tokenizer") if (v := getattr(data, f, None)) is not None]
    named = " ".join(fields) or f"data={getattr(data, 'name', '?')}"
    raise SampleError(
        f"{named}: tokenized by {got} but {model} was trained on {want}; give data encoded with the model's "
        f"tokenizer (dew-prepare --tokenizer {reuse} --out DIR FILES...)"
    )


def read_step(
    checkpoints: Checkpoints, step: int, abstract_params: nnx.State, ema: bool | None
) -> tuple[bool, nnx.State | None]:
    """(EMA used, parameters) of ``step``: the EMA when asked for (``ema``), else when the step kept
    one. The parameters are None when ``ema`` asks for an EMA the run did not keep."""
    kept = "ema" in checkpoints.saved(step)
    if ema and not kept:
        return False, None
    key = "ema" if (kept if ema is None else ema) else "params"
    state, _ = checkpoints.restore_part(step, {key: abstract_params})
    return key == "ema", state[key]


def read_params(
    checkpoints: Checkpoints,
    run_dir: str,
    chosen: int,
    abstract_params: nnx.State,
    *,
    ema: bool | None,
    asked: bool,
    prog: str = "dew-sample",
) -> tuple[int, bool, nnx.State | None, list[tuple[int, str]]]:
    """``(step, EMA used, parameters, damaged steps passed over)`` (``read_step``) of step ``chosen``
    or, when it is damaged and was not ``asked`` for by number, of the newest intact step before it
    (``Checkpoints.first_intact``); ``prog`` names the command in the line about a damaged step."""

    def say(bad: int, problem: str) -> None:
        print(
            f"{prog}: checkpoint step {bad} is damaged ({problem}); trying an earlier step",
            file=sys.stderr,
            flush=True,
        )

    earlier = [] if asked else sorted((s for s in checkpoints.all_steps() if s < chosen), reverse=True)
    try:
        step, (used, params), damaged = checkpoints.first_intact(
            [chosen, *earlier],
            lambda s: read_step(checkpoints, s, abstract_params, ema),
            on_damaged=None if asked else say,
        )
    except CheckpointDamagedError as err:
        if asked:
            raise SampleError(
                f"--step {chosen}: checkpoint step {chosen} in {checkpoints.step_path(chosen)} is "
                f"damaged: {err.damaged[0][1]}"
            ) from None
        raise SampleError(
            f"no checkpoint in {run_dir!r} can be read: "
            + "; ".join(f"step {s}: {problem}" for s, problem in err.damaged)
        ) from None
    return step, used, params, damaged


def restore(
    run_dir: str,
    *,
    step: int | None = None,
    latest: bool = False,
    ema: bool | None = None,
    overrides: Sequence[str] = (),
    prog: str = "dew-sample",
    start: bool = False,
) -> Restored:
    """Rebuild the run in ``run_dir`` (its record with the command line's ``overrides``, read as
    dew-train reads them) and restore its parameters at the best checkpoint (the latest with
    ``latest``, or ``step``); ``ema`` None uses the EMA when the run kept one. Data the overrides
    name is refused when its tokenizer is not the run's (``refuse_other_tokenizer``); the run's own
    data is not checked: samples are decoded with the tokenizer the run kept (``recorded_tokenizer``),
    even once the source it was read from holds another. ``start``: this process is the command's
    own, no backend open yet: it starts as the run's (``start_process``: the run's ``trainer.xla_flags``,
    its compilation cache, its NaN checks), as dew-eval's does, alone (no process pool)."""
    recipe = load_recipe(run_dir, overrides, prog)
    if start:
        start_process(dataclasses.replace(recipe.trainer, multi_host=False))
    recorded = load_recipe(run_dir) if overrides else None
    objective, dataset = rebuild(recipe, os.path.join(run_dir, RUN_RECORD), recorded)
    if recorded is not None and recipe.to_dict()["data"] != recorded.to_dict()["data"]:  # data named on the line
        tokenizer_dir = os.path.join(os.path.abspath(run_dir), TOKENIZER_DIR)
        refuse_other_tokenizer(saved_record(tokenizer_dir), dataset, recipe.data, f"run {run_dir}", tokenizer_dir)
    objective = recorded_tokenizer(objective, run_dir)
    checkpoints = run_checkpoints(recipe, objective, run_dir)
    try:
        chosen = choose_step(checkpoints, run_dir, step=step, latest=latest)
        # The module exactly as the trainer built it, then only the parameters (or their EMA) read back.
        abstract = nnx.eval_shape(lambda: adapt.build_model(recipe, objective))
        graphdef, abstract_params, rest = _split(abstract, recipe)
        chosen, ema_used, params, damaged = read_params(
            checkpoints, run_dir, chosen, abstract_params, ema=ema, asked=step is not None
        )
    finally:
        checkpoints.close()
    if params is None:
        raise SampleError(
            f"--ema: the run kept no EMA of its parameters (its objective's ema_decay is "
            f"{objective.ema_decay}); sample without --ema"
        )
    rest = concrete(recipe, objective, rest)
    _, rest = warmstart.load(recipe, params, rest, None, resuming=True, run_dir=run_dir)  # a LoRA run's base
    model = nnx.merge(graphdef, params, rest)
    return Restored(recipe, objective, dataset, model, chosen, ema_used, params, tuple(damaged))


def restore_named(args: argparse.Namespace, prog: str) -> Restored:
    """The run a command line names (``run_dir``, ``--step``, ``--latest``, ``--ema`` and the
    overrides: dew-sample's and dew-export's), restored in the command's own process, which starts
    as the run's (``restore``'s ``start``)."""
    return restore(
        args.run_dir,
        step=args.step,
        latest=args.latest,
        ema=args.ema,
        overrides=args.overrides,
        prog=prog,
        start=True,
    )


def for_inference(r: Restored) -> Restored:
    """``r`` with a LoRA run's factors merged into its weights (``dew.training.adapters.merge.merged_model``),
    so that the run samples exactly what its merged checkpoint (``dew-export --merge-lora``) samples;
    any other run (a LoRA run over a quantized base included, which has no merged form) as it is."""
    if r.recipe.lora is None or r.recipe.trainer.quantization is not None:
        return r
    return dataclasses.replace(r, model=merged_model(r.model, r.recipe, r.objective))


def concrete(recipe: Recipe, objective: Objective, rest: nnx.State) -> nnx.State:
    """The module's non-parameter state: as split off when it is concrete, else rebuilt from the seed
    (none of dew's models has any today)."""
    if not any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(rest)):
        return rest
    return _split(adapt.build_model(recipe, objective), recipe)[2]


def _split(model: nnx.Module, recipe: Recipe) -> tuple[nnx.GraphDef[nnx.Module], nnx.State, nnx.State]:
    """(graph, trained parameters, the rest) of ``model``, as the trainer splits it."""
    graphdef, params, rest = nnx.split(model, adapt.trainable(recipe.lora), ...)  # type: ignore[misc]  # nnx.split's stub returns a variadic tuple
    return graphdef, params, rest
