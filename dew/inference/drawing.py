"""The body of dew-sample (``dew.cli.sample`` parses its arguments): samples drawn from a restored run.

Images become a PNG grid, one row per class (named where the data names its classes), and on
request an ``.npz`` of the images (float32 NHWC in the data's [-1, 1]), their labels and the class
names; text is decoded with the tokenizer the dataset recorded, printed and written to a file.
Samples drawn with the same seed are identical.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import jax
import numpy as np

from dew.contract.objectives import can_sample, summary_name
from dew.contract.rundir import SAMPLE_PREFIX
from dew.data.tokenizer import from_record
from dew.inference.restore import Restored, SampleError, for_inference, restore_named
from dew.objectives.base import Objective
from dew.sampling import to_uint8, write_grid


def sample_images(
    r: Restored, *, count: int | None, seed: int, guidance_scale: float | None, steps: int | None, sampler: str | None
) -> tuple[Any, Any]:
    """Images (float32 NHWC in [-1, 1]) and labels, ``count`` per class, one class after another."""
    o: Any = r.objective  # an image objective: its sampler and knobs are its own
    per_class = count or o.knobs.samples_per_class
    labels = np.repeat(np.arange(max(o.num_classes, 1)), per_class).astype(np.int32)
    images = o.sample(
        r.model, labels, jax.random.PRNGKey(seed), steps=steps, guidance_scale=guidance_scale, sampler=sampler
    )
    return np.asarray(images, np.float32), labels


def sample_text(
    r: Restored,
    *,
    count: int | None,
    seed: int,
    steps: int | None,
    temperature: float | None,
    top_k: int | None,
    prompt: str | None,
    max_new_tokens: int | None = None,
) -> tuple[Any, list[str]]:
    """Token ids and their text."""
    o: Any = r.objective  # a text objective: its sampler and knobs are its own
    options: dict[str, Any] = {"temperature": temperature, "top_k": top_k}
    if max_new_tokens is not None:
        if not hasattr(o, "start_ids"):
            raise SampleError(
                f"--max-new-tokens: masked diffusion samples whole sequences of seq_len="
                f"{o.seq_len} tokens; it takes no length"
            )
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


def check_samples(objective: Objective) -> None:
    """Refuse a run whose objective draws no samples (a plugin's classifier, say), naming it."""
    if not can_sample(objective):
        name = summary_name(objective) or type(objective).__name__
        raise SampleError(
            f"the run's objective {name!r} cannot sample: it defines neither sample_grid (images) "
            "nor sample_text (text)"
        )


def run(args: argparse.Namespace) -> str:
    """Sample as ``args`` say; returns the file written."""
    r = restore_named(args, "dew-sample")
    check_samples(r.objective)
    r = for_inference(r)
    stem = os.path.join(args.run_dir, f"{SAMPLE_PREFIX}-step{r.step}-seed{args.seed}")
    source = f"step {r.step}, {'EMA' if r.ema else 'trained parameters'}, seed {args.seed}"
    if r.damaged:
        source += (
            f"; damaged step{'s' if len(r.damaged) > 1 else ''} {', '.join(str(s) for s, _ in r.damaged)} passed over"
        )
    if hasattr(r.objective, "sample_grid"):
        for name in ("temperature", "top_k", "prompt", "max_new_tokens"):
            if getattr(args, name) is not None:
                raise SampleError(f"--{name.replace('_', '-')}: the run samples images; it is a text option")
        images, labels = sample_images(
            r,
            count=args.count,
            seed=args.seed,
            guidance_scale=args.guidance_scale,
            steps=args.steps,
            sampler=args.sampler,
        )
        out = args.out or stem + ".png"
        write_grid(out, to_uint8(images), rows=max(getattr(r.objective, "num_classes", 1), 1), scale=4)
        names = tuple(getattr(r.dataset, "class_names", ()))  # image_folder, hf_images: run.json's data.classes
        if args.npz:
            arrays = {"images": images, "labels": labels} | ({"class_names": np.array(names)} if names else {})
            np.savez(args.npz, **arrays)
            print(f"dew-sample: images and labels in {args.npz}", flush=True)
        print(f"dew-sample: {len(images)} images ({source}) in {out}", flush=True)
        if names:
            print(f"dew-sample: rows, top to bottom: {', '.join(names)}", flush=True)
        return out
    for name in ("guidance_scale", "sampler", "npz"):
        if getattr(args, name) is not None:
            raise SampleError(f"--{name.replace('_', '-')}: the run samples text; it is an image option")
    _ids, texts = sample_text(
        r,
        count=args.count,
        seed=args.seed,
        steps=args.steps,
        temperature=args.temperature,
        top_k=args.top_k,
        prompt=args.prompt,
        max_new_tokens=args.max_new_tokens,
    )
    out = args.out or stem + ".txt"
    body = "".join(f"--- sample {i} ---\n{text}\n" for i, text in enumerate(texts))
    with open(out, "w", encoding="utf-8") as f:
        f.write(body)
    print(body, end="")
    print(f"dew-sample: {len(texts)} sequences ({source}) in {out}", flush=True)
    return out
