"""``dew-sample``: samples from a finished run directory, with no Hydra and no retyped config.

    dew-sample checkpoints/digits                       # best checkpoint, EMA, a PNG grid
    dew-sample checkpoints/digits --count 16 --guidance-scale 2 --npz digits.npz
    dew-sample checkpoints/tiny --latest --temperature 0.8 --top-k 40 --count 4
    dew-sample checkpoints/tiny_lm --prompt "The " --max-new-tokens 500

The run's ``run.json`` is read back as a ``Recipe`` (``dew.contract.config.RunRecord``); the dataset, the
resolved model fields and the objective are rebuilt through ``dew.build`` (the path ``dew-train``
built them through), the model's parameters (and their EMA) are restored from the chosen checkpoint
(``Checkpoints.restore_part``), without the optimizer state, and the objective's sampler draws from
them. Images become a PNG grid, one row per
class, and on request an ``.npz`` of the images (float32 NHWC in the data's [-1, 1]) and their
labels; text is decoded with the tokenizer the dataset recorded, printed and written to a file.
Samples drawn with the same seed are identical. A bad run directory ends with one message and exit
status 2. A damaged checkpoint (files lost, cut short or altered) is reported with its step and what
is wrong, and the newest intact step before it is sampled instead (``Checkpoints.first_intact``, the
walk a resume takes); ``--step N`` on a damaged step is an error.
dew-sample only reads: it takes no lock and moves nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from etils import epath
from flax import nnx

import dew
from dew.build import build_run
from dew.cli.console import console_script
from dew.contract.config import NoRunRecord, RunRecord
from dew.contract.data import Dataset
from dew.contract.objectives import can_sample, summary_name
from dew.contract.rundir import RUN_RECORD, SAMPLE_PREFIX
from dew.contract.typed import ConfigError, differences
from dew.data.tokenizer import from_record
from dew.objectives.base import Objective
from dew.recipe import Recipe
from dew.sampling import to_uint8, write_grid
from dew.training import adapt
from dew.training.adapters.merge import merged_model
from dew.training.checkpointing import warmstart
from dew.training.checkpointing.checkpoints import CheckpointDamagedError, Checkpoints

EXIT_BAD_INPUT = 2


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


def load_recipe(run_dir: str) -> Recipe:
    """The run's record (``RunRecord``) as a ``Recipe``, or a SampleError that says what is wrong with
    the directory."""
    if not os.path.isdir(run_dir):
        raise SampleError(f"run directory {run_dir!r} does not exist")
    try:
        return RunRecord.read(run_dir).typed(Recipe)
    except NoRunRecord as err:
        raise SampleError(str(err)) from None
    except (ConfigError, ValueError, TypeError) as err:
        raise SampleError(f"cannot read the run record: {err}. Was the run written by a different "
                          f"dew version? This is dew {dew.__version__}.") from None


def choose_step(checkpoints: Checkpoints, run_dir: str, *, step: int | None, latest: bool) -> int:
    steps = checkpoints.all_steps()
    if not steps:
        raise SampleError(f"{run_dir!r} holds no finished checkpoint: the run has not saved one yet, "
                          "or stopped before its first save")
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


def rebuild(recipe: Recipe, record: str) -> tuple[Objective, Dataset]:
    """(objective, dataset) built from the record as dew-train built them; refused when the data no
    longer gives the model the run was trained with."""
    try:
        resolved, objective, dataset = build_run(recipe)
    except (ValueError, FileNotFoundError) as err:
        raise SampleError(f"cannot rebuild the run from {record}: {err}") from None
    if resolved.to_dict() != recipe.to_dict():
        diff = differences(recipe.to_dict(), resolved.to_dict())
        raise SampleError("the data no longer gives the model the run was trained with (recorded -> "
                          "now):\n  " + "\n  ".join(diff))
    return objective, dataset


def read_step(checkpoints: Checkpoints, step: int, abstract_params: nnx.State,
              ema: bool | None) -> tuple[bool, nnx.State | None]:
    """(EMA used, parameters) of ``step``: the EMA when asked for (``ema``), else when the step kept
    one. The parameters are None when ``ema`` asks for an EMA the run did not keep."""
    kept = "ema" in checkpoints.saved(step)
    if ema and not kept:
        return False, None
    key = "ema" if (kept if ema is None else ema) else "params"
    state, _ = checkpoints.restore_part(step, {key: abstract_params})
    return key == "ema", state[key]


def read_params(checkpoints: Checkpoints, run_dir: str, chosen: int, abstract_params: nnx.State, *, ema: bool | None,
                asked: bool) -> tuple[int, bool, nnx.State | None, list[tuple[int, str]]]:
    """``(step, EMA used, parameters, damaged steps passed over)`` (``read_step``) of step ``chosen``
    or, when it is damaged and was not ``asked`` for by number, of the newest intact step before it
    (``Checkpoints.first_intact``)."""
    def say(bad: int, problem: str) -> None:
        print(f"dew-sample: checkpoint step {bad} is damaged ({problem}); trying an earlier step",
              file=sys.stderr, flush=True)

    earlier = [] if asked else sorted((s for s in checkpoints.all_steps() if s < chosen), reverse=True)
    try:
        step, (used, params), damaged = checkpoints.first_intact(
            [chosen, *earlier], lambda s: read_step(checkpoints, s, abstract_params, ema),
            on_damaged=None if asked else say)
    except CheckpointDamagedError as err:
        if asked:
            raise SampleError(f"--step {chosen}: checkpoint step {chosen} in {checkpoints.step_path(chosen)} is "
                              f"damaged: {err.damaged[0][1]}") from None
        raise SampleError(f"no checkpoint in {run_dir!r} can be read: "
                          + "; ".join(f"step {s}: {problem}" for s, problem in err.damaged)) from None
    return step, used, params, damaged


def restore(run_dir: str, *, step: int | None = None, latest: bool = False, ema: bool | None = None) -> Restored:
    """Rebuild the run in ``run_dir`` and restore its parameters at the best checkpoint (the
    latest with ``latest``, or ``step``); ``ema`` None uses the EMA when the run kept one."""
    recipe = load_recipe(run_dir)
    checkpoints = Checkpoints(epath.Path(os.path.abspath(run_dir)), keep=recipe.trainer.keep)
    try:
        chosen = choose_step(checkpoints, run_dir, step=step, latest=latest)
        objective, dataset = rebuild(recipe, os.path.join(run_dir, RUN_RECORD))
        # The module exactly as the trainer built it, then only the parameters (or their EMA) read back.
        abstract = nnx.eval_shape(lambda: adapt.build_model(recipe, objective))
        graphdef, abstract_params, rest = _split(abstract, recipe)
        chosen, ema_used, params, damaged = read_params(checkpoints, run_dir, chosen, abstract_params, ema=ema,
                                                        asked=step is not None)
    finally:
        checkpoints.close()
    if params is None:
        raise SampleError(f"--ema: the run kept no EMA of its parameters (its objective's ema_decay is "
                          f"{objective.ema_decay}); sample without --ema")
    rest = concrete(recipe, objective, rest)
    _, rest = warmstart.load(recipe, params, rest, None, resuming=True, run_dir=run_dir)  # a LoRA run's base
    model = nnx.merge(graphdef, params, rest)
    return Restored(recipe, objective, dataset, model, chosen, ema_used, params, tuple(damaged))


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


# ------------------------------------------------------------------------------------- sampling


def sample_images(r: Restored, *, count: int | None, seed: int, guidance_scale: float | None,
                  steps: int | None, sampler: str | None) -> tuple[Any, Any]:
    """Images (float32 NHWC in [-1, 1]) and labels, ``count`` per class, one class after another."""
    o: Any = r.objective  # an image objective: its sampler and knobs are its own
    per_class = count or o.knobs.samples_per_class
    labels = np.repeat(np.arange(max(o.num_classes, 1)), per_class).astype(np.int32)
    images = o.sample(r.model, labels, jax.random.PRNGKey(seed), steps=steps,
                      guidance_scale=guidance_scale, sampler=sampler)
    return np.asarray(images, np.float32), labels


def sample_text(r: Restored, *, count: int | None, seed: int, steps: int | None, temperature: float | None,
                top_k: int | None, prompt: str | None, max_new_tokens: int | None = None) -> tuple[Any, list[str]]:
    """Token ids and their text."""
    o: Any = r.objective  # a text objective: its sampler and knobs are its own
    options: dict[str, Any] = {"temperature": temperature, "top_k": top_k}
    if max_new_tokens is not None:
        if not hasattr(o, "start_ids"):
            raise SampleError(f"--max-new-tokens: masked diffusion samples whole sequences of seq_len="
                              f"{o.seq_len} tokens; it takes no length")
        options["max_new_tokens"] = max_new_tokens
    if hasattr(o.knobs, "sample_steps"):
        options["steps"] = steps
    elif steps is not None:
        raise SampleError("--steps: next-token sampling draws one token per step; it takes no step count")
    if prompt is not None:
        if not hasattr(o, "start_ids"):
            raise SampleError("--prompt: masked diffusion samples whole sequences; it takes no prompt")
        if o.tokenizer is None:
            raise SampleError("--prompt: the run's data recorded no tokenizer to encode it with")
        options["prompt"] = [int(i) for i in from_record(o.tokenizer).encode(prompt)]
    try:
        return o.sample_text(r.model, jax.random.PRNGKey(seed), count, **options)
    except ValueError as err:  # the prompt's length (the options' ranges are checked on parsing)
        raise SampleError(f"--prompt: {err}") from None


# ------------------------------------------------------------------------------------- the command


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dew-sample", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", help="the run directory (<trainer.checkpoint_dir>/<name>)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="sample from this saved step (default: the best)")
    which.add_argument("--latest", action="store_true", help="sample from the latest saved step")
    p.add_argument("--count", type=int, help="images per class, or text sequences (default: the "
                   "objective's samples_per_class / samples knob)")
    p.add_argument("--seed", type=int, default=0, help="seed of every draw (default 0)")
    p.add_argument("--ema", action=argparse.BooleanOptionalAction, default=None,
                   help="sample with the EMA of the parameters (default: when the run kept one)")
    p.add_argument("--steps", type=int, help="sampler steps (flow matching, masked diffusion)")
    p.add_argument("--guidance-scale", type=float, help="classifier-free guidance weight (images)")
    p.add_argument("--sampler", choices=("euler", "heun"), help="ODE solver (images)")
    p.add_argument("--temperature", type=float, help="logit temperature (text)")
    p.add_argument("--top-k", type=int, help="draw among the k most likely tokens; 0 keeps all (text)")
    p.add_argument("--prompt", help="text the sequences continue (next-token runs)")
    p.add_argument("--max-new-tokens", type=int, help="tokens drawn after the prompt (next-token runs; default: up "
                   "to the model's seq_len; beyond it the context is a window that moves on by half its length)")
    p.add_argument("--out", help="the PNG grid or the text file (default: samples-step<N>-seed<S>.png "
                   "or .txt in the run directory)")
    p.add_argument("--npz", help="also write the images and their labels to this .npz (images)")
    args = p.parse_args(argv)
    for name in ("count", "steps", "max_new_tokens"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.temperature is not None and args.temperature <= 0:
        p.error("--temperature must be > 0")
    if args.top_k is not None and args.top_k < 0:
        p.error("--top-k must be >= 0")
    return args


def check_samples(objective: Objective) -> None:
    """Refuse a run whose objective draws no samples (a plugin's classifier, say), naming it."""
    if not can_sample(objective):
        name = summary_name(objective) or type(objective).__name__
        raise SampleError(f"the run's objective {name!r} cannot sample: it defines neither sample_grid (images) "
                          "nor sample_text (text)")


def run(args: argparse.Namespace) -> str:
    """Sample as ``args`` say; returns the file written."""
    r = restore(args.run_dir, step=args.step, latest=args.latest, ema=args.ema)
    check_samples(r.objective)
    r = for_inference(r)
    stem = os.path.join(args.run_dir, f"{SAMPLE_PREFIX}-step{r.step}-seed{args.seed}")
    source = f"step {r.step}, {'EMA' if r.ema else 'trained parameters'}, seed {args.seed}"
    if r.damaged:
        source += f"; damaged step{'s' if len(r.damaged) > 1 else ''} {', '.join(str(s) for s, _ in r.damaged)} passed over"
    if hasattr(r.objective, "sample_grid"):
        for name in ("temperature", "top_k", "prompt", "max_new_tokens"):
            if getattr(args, name) is not None:
                raise SampleError(f"--{name.replace('_', '-')}: the run samples images; it is a text option")
        images, labels = sample_images(r, count=args.count, seed=args.seed, guidance_scale=args.guidance_scale,
                                       steps=args.steps, sampler=args.sampler)
        out = args.out or stem + ".png"
        write_grid(out, to_uint8(images), rows=max(getattr(r.objective, "num_classes"), 1), scale=4)
        if args.npz:
            np.savez(args.npz, images=images, labels=labels)
            print(f"dew-sample: images and labels in {args.npz}", flush=True)
        print(f"dew-sample: {len(images)} images ({source}) in {out}", flush=True)
        return out
    for name in ("guidance_scale", "sampler", "npz"):
        if getattr(args, name) is not None:
            raise SampleError(f"--{name.replace('_', '-')}: the run samples text; it is an image option")
    ids, texts = sample_text(r, count=args.count, seed=args.seed, steps=args.steps,
                             temperature=args.temperature, top_k=args.top_k, prompt=args.prompt,
                             max_new_tokens=args.max_new_tokens)
    out = args.out or stem + ".txt"
    body = "".join(f"--- sample {i} ---\n{text}\n" for i, text in enumerate(texts))
    with open(out, "w", encoding="utf-8") as f:
        f.write(body)
    print(body, end="")
    print(f"dew-sample: {len(texts)} sequences ({source}) in {out}", flush=True)
    return out


@console_script
def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import logging

    logging.getLogger("absl").setLevel(logging.ERROR)  # orbax reports reading one item as a warning
    try:
        run(args)
    except (SampleError, ConfigError, FileNotFoundError, json.JSONDecodeError) as err:
        print(f"dew-sample: error: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


if __name__ == "__main__":
    main()
