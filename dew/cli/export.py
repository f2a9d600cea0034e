"""dew-export: write a trained run's model in another layout.

    dew-export RUN_DIR --to OUT                a ``transformer`` run in the Hugging Face Llama layout:
                                               config.json, model.safetensors and, where the run's data
                                               has a BPE tokenizer, tokenizer.json (a LoRA run is
                                               merged first)
    dew-export RUN_DIR --merge-lora --to OUT   a LoRA run merged into a plain run of the full model
                                               (W + (alpha/rank)·A·B), which dew-sample, dew-export
                                               and trainer.init_from read like any run

The parameters are those dew-sample would sample with: the best checkpoint (or --step / --latest),
the EMA when the run kept one (--no-ema for the trained parameters). OUT must not exist yet.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence

from flax import nnx

from dew.cli.console import console_script
from dew.cli.sample import Restored, SampleError, load_recipe, restore
from dew.contract.typed import ConfigError
from dew.recipe import Recipe
from dew.training.adapters import merge
from dew.training.adapters.merge import MergeError
from dew.training.checkpointing import hf_llama

EXIT_BAD_INPUT = 2


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dew-export", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("run_dir", help="the run directory (<trainer.checkpoint_dir>/<name>)")
    p.add_argument("--to", required=True, help="the directory to write; it must not exist")
    p.add_argument("--merge-lora", action="store_true",
                   help="merge a LoRA run's factors into its base and write a plain dew run (default: "
                   "write the Hugging Face Llama layout)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="export this saved step (default: the best)")
    which.add_argument("--latest", action="store_true", help="export the latest saved step")
    p.add_argument("--ema", action=argparse.BooleanOptionalAction, default=None,
                   help="export the EMA of the parameters (default: when the run kept one)")
    return p.parse_args(argv)


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
        raise merge.MergeError(f"the Hugging Face Llama layout holds a {hf_llama.ARCHITECTURE!r}; the run is a "
                               f"{recipe.model.architecture!r}")
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


@console_script
def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import logging

    logging.getLogger("absl").setLevel(logging.ERROR)
    try:
        out = run(args)
    except (SampleError, MergeError, ConfigError, FileNotFoundError) as err:
        print(f"dew-export: error: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    print(f"dew-export: {args.run_dir} {'merged into' if args.merge_lora else 'in the Hugging Face layout in'} {out}",
          flush=True)


if __name__ == "__main__":
    main()
