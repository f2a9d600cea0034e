"""dew-export: write a trained run's model in another layout.

    dew-export RUN_DIR --to OUT                a ``transformer`` run in the Hugging Face Llama layout:
                                               config.json, generation_config.json, model.safetensors
                                               (or shards and model.safetensors.index.json past
                                               --max-shard-size; --dtype bfloat16 or float16 to halve
                                               it), and the data's tokenizer as tokenizer.json and
                                               tokenizer_config.json (a LoRA run is merged first)
    dew-export RUN_DIR --merge-lora --to OUT   a LoRA run merged into a plain run of the full model
                                               (W + (alpha/rank)·A·B), which dew-sample, dew-export
                                               and trainer.init_from read like any run

The parameters are those dew-sample would sample with: the best checkpoint (or --step / --latest),
the EMA when the run kept one (--no-ema for the trained parameters). OUT must not exist yet.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from dew.commandline.console import console_script
from dew.commandline.exits import EXIT_BAD_INPUT
from dew.commandline.overrides import add_override_arguments, not_overrides
from dew.contract.typed import ConfigError


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="dew-export",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    p.add_argument("run_dir", help="the run directory (<trainer.checkpoint_dir>/<name>)")
    add_override_arguments(p)
    p.add_argument("--to", required=True, help="the directory to write; it must not exist")
    p.add_argument(
        "--merge-lora",
        action="store_true",
        help="merge a LoRA run's factors into its base and write a plain dew run (default: "
        "write the Hugging Face Llama layout)",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="the Hugging Face weights' dtype (default: float32)",
    )
    p.add_argument(
        "--max-shard-size",
        help="split the Hugging Face weights into shards of at most this size, with "
        "model.safetensors.index.json (5GB, 500MB, 2GiB; default: one file)",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="export this saved step (default: the best)")
    which.add_argument("--latest", action="store_true", help="export the latest saved step")
    p.add_argument(
        "--ema",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="export the EMA of the parameters (default: when the run kept one)",
    )
    args = p.parse_intermixed_args(argv)
    if bad := not_overrides(args.overrides):
        p.error(bad)
    return args


@console_script
def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.cfg:
        from dew.inference.composing import print_config  # heavy: Hydra composes the config, --cfg alone

        sys.exit(print_config(args.run_dir, args.overrides, "dew-export"))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import logging

    logging.getLogger("absl").setLevel(logging.ERROR)
    # heavy: JAX, orbax and the model load only once the arguments are good (--help and a bad option stay instant)
    from dew.inference import exporting, restore
    from dew.training.adapters.merge import MergeError

    try:
        out = exporting.run(args)
    except (restore.SampleError, MergeError, ConfigError, FileNotFoundError) as err:
        print(f"dew-export: error: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    print(
        f"dew-export: {args.run_dir} {'merged into' if args.merge_lora else 'in the Hugging Face layout in'} {out}",
        flush=True,
    )


if __name__ == "__main__":
    main()
