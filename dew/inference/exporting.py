"""The body of dew-export (``dew.cli.export`` parses its arguments): a restored run written in
the Hugging Face Llama layout, or a LoRA run merged into a plain run."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

from flax import nnx

from dew.inference.restore import Restored, load_recipe, restore_named
from dew.recipe import Recipe
from dew.training.adapters import merge
from dew.training.checkpointing import hf_llama, hf_tokenizer, hf_weights


def run(args: argparse.Namespace) -> str:
    """Export as ``args`` say; returns the directory written."""
    if os.path.exists(args.to):
        raise merge.MergeError(f"--to {args.to}: it exists; dew-export writes a new directory")
    if args.merge_lora and (args.dtype != "float32" or args.max_shard_size is not None):
        raise merge.MergeError(
            "--dtype and --max-shard-size choose the Hugging Face layout's files; --merge-lora writes a dew run"
        )
    if args.max_shard_size is not None:
        try:
            hf_weights.parse_size(args.max_shard_size)
        except ValueError as err:
            raise merge.MergeError(str(err)) from None
    check(load_recipe(args.run_dir, args.overrides, "dew-export"), merge_lora=args.merge_lora)  # before the rebuild
    r = restore_named(args, "dew-export")
    if args.merge_lora:
        params = merge.merged(r.model, r.recipe)
        merge.write_run(r.recipe, params, args.to, step=r.step, merged_from=os.path.abspath(args.run_dir))
        return args.to
    return write_hf(r, args.to, dtype=args.dtype, max_shard_size=args.max_shard_size)


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


def write_hf(r: Restored, out: str, *, dtype: str = "float32", max_shard_size: str | None = None) -> str:
    """The restored run ``r`` in the Hugging Face Llama layout at ``out``: the weights in ``dtype``
    (sharded past ``max_shard_size``), ``config.json``, ``generation_config.json`` and the tokenizer
    files of the run's data. Written into a temporary sibling directory that is renamed to ``out``
    once whole, so a failure leaves nothing at ``out``."""
    try:
        max_bytes = None if max_shard_size is None else hf_weights.parse_size(max_shard_size)
    except ValueError as err:
        raise merge.MergeError(str(err)) from None
    if r.recipe.lora is not None:
        params = merge.merged(r.model, r.recipe)
    else:
        params = {"/".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(r.model, nnx.Param))}
    fields = hf_llama.fields_of(r.recipe)
    record = getattr(r.objective, "tokenizer", None)
    eos = record.get("eos_id") if record else None
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's directory is the user's alone; OUT is an ordinary one
    try:
        hf_weights.write_directory(
            fields, params, tmp, dtype=dtype, max_bytes=max_bytes, eos_token_id=eos if isinstance(eos, int) else None
        )
        hf_tokenizer.write(record, tmp, max_length=fields.seq_len)
        os.rename(tmp, out)
    except ValueError as err:
        raise merge.MergeError(str(err)) from None
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
    return out
