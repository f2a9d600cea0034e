"""The body of dew-export (``dew.cli.export`` parses its arguments): a restored run written in
the Hugging Face Llama layout, or a LoRA run merged into a plain run."""

from __future__ import annotations

import argparse
import os
import shutil

from flax import nnx

from dew.cli.restore import Restored, load_recipe, restore
from dew.recipe import Recipe
from dew.training.adapters import merge
from dew.training.checkpointing import hf_llama


def run(args: argparse.Namespace) -> str:
    """Export as ``args`` say; returns the directory written."""
    if os.path.exists(args.to):
        raise merge.MergeError(f"--to {args.to}: it exists; dew-export writes a new directory")
    check(load_recipe(args.run_dir), merge_lora=args.merge_lora)  # before the slow rebuild
    r = restore(args.run_dir, step=args.step, latest=args.latest, ema=args.ema)
    if args.merge_lora:
        params = merge.merged(r.model, r.recipe)
        merge.write_run(r.recipe, params, args.to, step=r.step, merged_from=os.path.abspath(args.run_dir))
        return args.to
    return write_hf(r, args.to)


def check(recipe: Recipe, *, merge_lora: bool) -> None:
    """Refuse, from the run's record alone, what the export cannot write."""
    if merge_lora:
        if recipe.lora is None:
            raise merge.MergeError("--merge-lora: the run has no lora: its checkpoint already holds the full model")
        return
    if recipe.model.architecture != hf_llama.ARCHITECTURE:
        raise merge.MergeError(
            f"the Hugging Face Llama layout holds a {hf_llama.ARCHITECTURE!r}; the run is a "
            f"{recipe.model.architecture!r}"
        )
    try:
        hf_llama.refuse_unmappable(hf_llama.fields_of(recipe), "dew-export")
    except ValueError as err:
        raise merge.MergeError(str(err)) from None


def write_hf(r: Restored, out: str) -> str:
    """The restored run ``r`` in the Hugging Face Llama layout at ``out``."""
    if r.recipe.lora is not None:
        params = merge.merged(r.model, r.recipe)
    else:
        params = {"/".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(r.model, nnx.Param))}
    try:
        hf_llama.write(hf_llama.fields_of(r.recipe), params, out)
    except ValueError as err:
        raise merge.MergeError(str(err)) from None
    record = getattr(r.objective, "tokenizer", None) or {}
    if record.get("kind") == "bpe":  # a `tokenizers` file is Hugging Face's own tokenizer.json
        shutil.copyfile(str(record["file"]), os.path.join(out, "tokenizer.json"))
    return out
