"""The body of dew-eval (``dew.cli.eval`` parses its arguments): a run's parameters (or a Hugging Face
Llama directory's) evaluated on a dataset's held-out split by the trainer's own evaluation.

The recipe is the run's record with the command line's overrides (``dew.inference.composing``). The
process is started as a run's is (``start_process``: the XLA flags, the compilation cache, the JAX
process pool), the data and the objective are built by ``dew.build`` as dew-train builds them, and
data encoded by another tokenizer than the model's (identified by content:
``dew.data.tokenizer_identity``) or a model they no longer give (data of another vocabulary) is
refused. The parameters of the chosen step (or their EMA) are restored by orbax straight into the
layout the trainer gives them on the run's mesh, each process reading its own shards; a Hugging Face
directory is read by the warm start's reader (``dew.training.checkpointing.warmstart``). The
evaluation is the trainer's: ``compile_eval_step`` and ``Evaluator``, the objective's loss and the
metrics dew-train evaluates the objective with, summed over every batch on the devices, with the same
per-batch keys, so the loss at a step is the one the trainer's journal recorded there.

For a next-token model on data with a tokenizer, the bytes the targets stand for are counted beside
(each batch carries them in a ``bytes`` field: the byte tokenizer's targets are one byte each, any
other tokenizer's are the UTF-8 bytes of the decoded targets), and bits per byte is the loss in bits
over the bytes per token. Both count only the targets that carry loss (packed documents' padding and
the targets across their boundaries, a chat's prompt, are in neither), as the loss and the perplexity
do.

Process 0 prints a table and writes the values as JSON (a temporary file renamed into place) in
``<run>/eval/``; nothing else in the run directory is written, its checkpoints and journal included.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from dew.build import build_run
from dew.commandline.configs import conf_dir
from dew.contract.data import Batch, Dataset, SourcedDataset, eval_sources
from dew.contract.models import architecture
from dew.contract.objectives import objectives, summary_name
from dew.contract.rundir import TOKENIZER_DIR
from dew.contract.typed import ConfigError
from dew.data.tokenizer import TOKENIZER_FILE, from_record, saved_record
from dew.inference import restore
from dew.inference.composing import EvalError, Target, target
from dew.objectives.base import Batch as DeviceBatch
from dew.objectives.base import Metric, Objective
from dew.objectives.metrics import builtin_metrics
from dew.objectives.tokens import target_weights
from dew.recipe import Recipe
from dew.training import adapt, task_evals
from dew.training.assembly import batch_sharding as lay_out_batches
from dew.training.assembly import (
    check_batches,
    compile_eval_step,
    global_batch,
    initial_params,
    laid_out,
    mesh_of,
    param_shardings,
)
from dew.training.checkpointing import warmstart
from dew.training.evaluate import Evaluator, derived_metrics
from dew.training.setup import start_process

EVAL_DIR = "eval"
"""The directory in the evaluated run's (or Hugging Face directory's) that takes the results."""


@dataclasses.dataclass(frozen=True)
class Result:
    """One evaluation: what was evaluated, on what, and the values."""

    target: str
    kind: str
    step: int | None
    """The checkpoint's step (None for a Hugging Face directory)."""
    ema: bool
    data: Mapping[str, object]
    """The data's record (``run.json``'s ``data`` section) evaluated on."""
    overrides: Sequence[str]
    values: Mapping[str, float]
    records: int | None
    """The held-out records evaluated (None where the dataset does not say, or with ``--tasks-only``)."""
    seconds: float
    tasks: Mapping[str, Sequence[Mapping[str, object]]] = dataclasses.field(default_factory=dict)
    """Each downstream task's examples as scored (``trainer.evals``; empty without)."""

    def record(self) -> dict[str, object]:
        return {
            "target": self.target,
            "kind": self.kind,
            "step": self.step,
            "ema": self.ema,
            "data": dict(self.data),
            "overrides": list(self.overrides),
            "metrics": dict(self.values),
            "records": self.records,
            "processes": jax.process_count(),
            "devices": jax.device_count(),
            "seconds": round(self.seconds, 3),
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            **({"tasks": {k: list(v) for k, v in self.tasks.items()}} if self.tasks else {}),
        }


def run(args: argparse.Namespace) -> tuple[Result, str | None]:
    """Evaluate as ``args`` say: the result, and the file process 0 wrote (None on the others)."""
    started = time.monotonic()
    t = target(args.run, args.overrides, conf_dir())
    start_process(t.recipe.trainer)  # the flags, the cache and the pool, before any backend opens
    recipe, objective, dataset = rebuild(t)
    tasks_only = bool(getattr(args, "tasks_only", False))
    if tasks_only and (recipe.trainer.evals is None or not recipe.trainer.evals.tasks):
        raise EvalError(
            "--tasks-only: the run names no downstream tasks (trainer.evals); name them: "
            "'trainer.evals={tasks: [{name: NAME, path: FILE.jsonl}]}'"
        )
    mesh = mesh_of(recipe.trainer)
    try:  # the run's batch divides over this pool's mesh, and no row sits on two processes' devices
        batches = [(recipe.trainer.batch_size, "trainer.batch_size")]
        if recipe.trainer.evals is not None:
            batches.append((recipe.trainer.evals.batch_size, "trainer.evals.batch_size"))
        check_batches(recipe.trainer, mesh, batches, accumulation=1)
    except ValueError as err:
        raise EvalError(str(err)) from None
    graphdef, params, rest, step, ema = parameters(t, recipe, objective, mesh, args)
    values = {} if tasks_only else held_out(recipe, objective, dataset, mesh, graphdef, params, rest)
    scored = scored_tasks(recipe, objective, mesh, graphdef, params, rest)
    if scored is not None:
        values.update(scored[0])
    result = Result(
        t.path,
        t.kind,
        step,
        ema,
        recipe.to_dict()["data"],
        list(args.overrides),
        values,
        None if tasks_only else getattr(dataset, "num_eval_records", None),
        time.monotonic() - started,
        {} if scored is None else scored[1],
    )
    if jax.process_index() != 0:
        return result, None
    return result, write(result, args.out or os.path.join(t.path, EVAL_DIR, file_name(result)))


def held_out(
    recipe: Recipe,
    objective: Objective,
    dataset: Dataset,
    mesh: Mesh,
    graphdef: nnx.GraphDef,
    params: nnx.State,
    rest: nnx.State,
) -> dict[str, float]:
    """The trainer's evaluation of ``params`` on the dataset's held-out split (bits per byte beside,
    for text), and of each held-out source on its own where the data names them (a mixture's
    components: ``eval/<source>/loss``..., as the loop reports them)."""
    batch_sharding = lay_out_batches(mesh, recipe.trainer)
    counter = byte_counter(objective, dataset)
    metrics: list[Metric] = [*builtin_metrics(objective), *([TargetBytes()] if counter is not None else [])]
    eval_step = compile_eval_step(
        objective,
        graphdef,
        rest,
        metrics,
        recipe.trainer,
        mesh,
        param_shardings(params, mesh, recipe.trainer),
        batch_sharding,
    )

    def counted(own: Iterator[Batch]) -> Iterator[Batch]:
        return own if counter is None else with_bytes(own, counter)

    def batches() -> Iterator[Batch]:
        return counted(dataset.eval_batches(jax.process_index(), jax.process_count()))

    def sources() -> dict[str, Iterator[Batch]]:  # a mixture's components, each reported as the loop does
        assert isinstance(dataset, SourcedDataset)
        by_source = dataset.source_eval_batches(jax.process_index(), jax.process_count())
        return {name: counted(own) for name, own in by_source.items()}

    evaluator = Evaluator(
        eval_step,
        batches,
        functools.partial(global_batch, batch_sharding=batch_sharding),
        seed=recipe.trainer.seed,
        derive=functools.partial(derived_metrics, objective),
        sources=sources if eval_sources(dataset) else None,
    )
    values = evaluator(params)
    if not values:
        raise EvalError(
            f"data={getattr(recipe.data, 'name', '?')}: the data holds no held-out split to evaluate on; "
            "name one (data.val_path=FILE, data.val_fraction=...), or score the tasks alone (--tasks-only)"
        )
    if counter is not None and values.get("eval/bytes_per_token"):
        values["eval/bits_per_byte"] = bits_per_byte(values["eval/loss"], values["eval/bytes_per_token"])
    return values


def scored_tasks(
    recipe: Recipe, objective: Objective, mesh: Mesh, graphdef: nnx.GraphDef, params: nnx.State, rest: nnx.State
) -> tuple[dict[str, float], dict[str, list[dict[str, object]]]] | None:
    """The downstream tasks (``trainer.evals``) scored on ``params`` as the trainer scores them:
    their values, and each task's examples (each choice's log-likelihood and greedy flag, the gold
    choice and the predictions); None when the run names none."""
    evals = recipe.trainer.evals
    if evals is None or not evals.tasks:
        return None
    try:
        tasks = task_evals.load(evals, objective)
        _, seq_len = task_evals.encoding_of(objective)
    except ValueError as err:
        raise EvalError(" ".join(str(err).split())) from None
    shardings = param_shardings(params, mesh, recipe.trainer)
    evaluator = task_evals.evaluator(tasks, evals.batch_size, seq_len, graphdef, rest, recipe.trainer, mesh, shardings)
    examples = evaluator.examples(params)
    per_example = {name: [dataclasses.asdict(e) for e in scored] for name, scored in examples.items()}
    return evaluator.values(examples), per_example


# ------------------------------------------------------------------------------ the run rebuilt


def rebuild(t: Target) -> tuple[Recipe, Objective, Dataset]:
    """(resolved recipe, objective, dataset) as dew-train builds them, the model fields that follow
    from the data filled in from the data; a model the data does not give (a vocabulary larger than
    the model's rows, another sequence length than the run's or the directory's) is refused in one
    line. A padded field (``Architecture.padded_fields``: a vocabulary with rows past the data's)
    stays the model's. Data whose tokenizer is not the one the model was trained on (the run's, the
    Hugging Face directory's) is refused before that, whatever its vocabulary
    (``restore.refuse_other_tokenizer``)."""
    arch = architecture(t.recipe.model.architecture)
    from_data = [k for k in arch.data_fields if k not in arch.padded_fields]
    config = {k: v for k, v in t.recipe.model.config.items() if k not in from_data}
    unfilled = dataclasses.replace(t.recipe, model=dataclasses.replace(t.recipe.model, config=config))
    try:
        resolved, objective, dataset = build_run(unfilled)
    except (ConfigError, ValueError, FileNotFoundError) as err:
        raise EvalError(" ".join(str(err).split())) from None
    assert isinstance(resolved, Recipe)
    trained_on, reuse = model_tokenizer(t)
    try:
        restore.refuse_other_tokenizer(trained_on, dataset, resolved.data, model_named(t), reuse)
    except restore.SampleError as err:
        raise EvalError(str(err)) from None
    wanted, given = t.recipe.model.config, resolved.model.config
    diff = [
        f"model.config.{k}={wanted[k]}, the data's {given.get(k)}"
        for k in from_data
        if k in wanted and given.get(k) != wanted[k]
    ]
    if diff:
        model = "the run's" if t.kind == "run" else "config.json's"
        raise EvalError(
            f"the data does not fit {model} model: {'; '.join(diff)}; evaluate on tokens of the model's "
            "tokenizer (data of its shapes)"
        )
    return resolved, objective, dataset


def model_tokenizer(t: Target) -> tuple[Mapping[str, object] | None, str]:
    """(the tokenizer record the model was trained on, what ``dew-prepare --tokenizer`` takes to
    encode with it): a run's ``TOKENIZER_DIR``, a Hugging Face directory's ``tokenizer.json``; no
    record where there is none (an older run, a directory without a tokenizer)."""
    if t.kind == "hf":
        file = os.path.join(t.path, TOKENIZER_FILE)
        return ({"kind": "pretrained", "file": file} if os.path.isfile(file) else None), t.path
    folder = os.path.join(t.path, TOKENIZER_DIR)
    return saved_record(folder), folder


def model_named(t: Target) -> str:
    return f"run {t.path}" if t.kind == "run" else f"the model in {t.path}"


def parameters(
    t: Target, recipe: Recipe, objective: Objective, mesh: Mesh, args: argparse.Namespace
) -> tuple[nnx.GraphDef, nnx.State, nnx.State, int | None, bool]:
    """(graph, parameters on the mesh, the rest of the module, the step, whether the EMA) of the run's
    chosen checkpoint, or of the Hugging Face directory."""
    if t.kind == "hf":
        if args.step is not None or args.latest or args.ema:
            raise EvalError(f"{t.path} is a Hugging Face directory: it has no steps and no EMA")
        try:
            warmstart.check(recipe, nnx.eval_shape(lambda: adapt.build_model(recipe, objective)))
        except ValueError as err:
            raise EvalError(" ".join(str(err).split())) from None
        graphdef, params, rest = initial_params(recipe, objective, mesh, resuming=False)
        return graphdef, params, rest, None, False
    abstract = nnx.eval_shape(lambda: adapt.build_model(recipe, objective))
    graphdef, abstract_params, rest = nnx.split(abstract, adapt.trainable(recipe.lora), ...)  # type: ignore[misc]  # nnx.split's stub returns a variadic tuple
    placed = laid_out(abstract_params, mesh, recipe.trainer)
    checkpoints = restore.run_checkpoints(recipe, objective, t.path)
    try:
        chosen = restore.choose_step(checkpoints, t.path, step=args.step, latest=args.latest)
        step, ema, read, _ = restore.read_params(
            checkpoints, t.path, chosen, placed, ema=bool(args.ema), asked=args.step is not None, prog="dew-eval"
        )
    except restore.SampleError as err:
        raise EvalError(str(err)) from None
    finally:
        checkpoints.close()
    if read is None:
        raise EvalError(
            f"--ema: the run kept no EMA of its parameters (its objective's ema_decay is {objective.ema_decay})"
        )
    rest = restore.concrete(recipe, objective, rest)
    _, rest = warmstart.load(recipe, read, rest, None, resuming=True, run_dir=t.path)  # a LoRA run's base
    return graphdef, read, rest, step, ema


# --------------------------------------------------------------------------------- bits per byte


@dataclasses.dataclass
class TargetBytes:
    """The bytes of text each target token stands for, on average over the held-out targets that carry
    loss: the ``bytes`` field ``with_bytes`` adds to a batch (each record's), over those targets
    (``target_weights``: packed documents' padding, the targets across their boundaries and a chat's
    prompt are neither bytes nor tokens here, as they are not in the loss)."""

    name: str = "bytes_per_token"
    best: bool = False
    higher_is_better: bool = False

    def __call__(self, model: nnx.Module, batch: DeviceBatch, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        del model, key
        mask = batch["mask"].astype(jnp.float32)
        return (batch["bytes"].astype(jnp.float32) * mask).sum(), (target_weights(batch).sum(axis=1) * mask).sum()


def byte_counter(objective: Objective, dataset: Dataset) -> Callable[[np.ndarray, np.ndarray], np.ndarray] | None:
    """Each record's byte count from its targets and their weights (``[records, targets]`` each), for a
    next-token objective on data with a tokenizer; None where bytes mean nothing (images, a vocabulary
    given by ``data.vocab_size`` alone, a loss that is not nats per token)."""
    name = summary_name(objective)
    record = getattr(dataset, "tokenizer", None)
    if name is None or name not in objectives or objectives[name].loss_unit != "nats/token" or not record:
        return None
    if record.get("kind") == "byte":  # each id is one byte (the end-of-text id stands for one too)
        return lambda targets, weights: weights.sum(axis=1).astype(np.float32)
    tokenizer = from_record(record)

    def count(targets: np.ndarray, weights: np.ndarray) -> np.ndarray:
        # Each run of counted targets (a document's, a chat's response) decoded on its own, as its text.
        edges = np.diff(np.pad(weights > 0, ((0, 0), (1, 1))).astype(np.int8), axis=1)
        return np.array(
            [
                sum(len(tokenizer.decode(row[a:b].tolist()).encode("utf-8")) for a, b in zip(*runs))
                for row, runs in zip(targets, ((np.flatnonzero(e == 1), np.flatnonzero(e == -1)) for e in edges))
            ],
            np.float32,
        )

    return count


def with_bytes(batches: Iterator[Batch], count: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Iterator[Batch]:
    for batch in batches:
        host = {k: np.asarray(v) for k, v in batch.items()}
        yield {**batch, "bytes": count(host["tokens"][:, 1:], target_weights(host))}


def bits_per_byte(loss: float, bytes_per_token: float) -> float:
    """Bits per byte of text: the loss (nats per counted target) in bits, over the bytes per counted
    target."""
    return loss / math.log(2) / bytes_per_token


# ------------------------------------------------------------------------------------ the report


def file_name(result: Result) -> str:
    """``step<N>[-ema]-<data>[-<digest of the overrides>].json`` (``hf-...`` for a Hugging Face
    directory): the same evaluation again replaces its file, another one takes its own."""
    head = "hf" if result.step is None else f"step{result.step}"
    tasks_only = result.tasks and "eval/loss" not in result.values
    scored = "tasks" if tasks_only else result.data.get("name", "data")
    name = f"{head}{'-ema' if result.ema else ''}-{scored}"
    if result.overrides:
        name += "-" + hashlib.sha256(" ".join(result.overrides).encode()).hexdigest()[:8]
    return name + ".json"


def write(result: Result, path: str) -> str:
    """``result`` as JSON at ``path``, written whole: a temporary file beside it, renamed."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = f"{path}.tmp-{os.getpid()}"
    with open(partial, "w") as fh:
        json.dump(result.record(), fh, indent=2)
        fh.write("\n")
    os.replace(partial, path)
    return path


def table(result: Result) -> str:
    """The values, one per line, under a line saying what was evaluated on what."""
    what = "the Hugging Face directory" if result.step is None else f"step {result.step}"
    params = "" if result.step is None else (" (EMA)" if result.ema else " (parameters)")
    records = "" if result.records is None else f" ({result.records} records)"
    split = f"the held-out split of {result.data.get('name', 'the data')}{records}"
    if result.tasks:
        tasks = f"the tasks {', '.join(result.tasks)}"
        split = tasks if "eval/loss" not in result.values else f"{split} and {tasks}"
    lines = [f"{result.target}: {what}{params}, on {split}"]
    width = max(len(k) for k in result.values)
    lines += [f"  {k:<{width}}  {v:.6g}" for k, v in sorted(result.values.items())]
    return "\n".join(lines)


def report(result: Result, written: str | None, out: Any = sys.stdout) -> None:
    if written is None:
        return
    print(table(result), file=out)
    print(f"dew-eval: results in {written}", file=out, flush=True)
