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

This module parses the arguments and loads no JAX (``--help`` and a bad option answer at once);
``dew.inference.restore`` rebuilds the run and ``dew.inference.drawing`` draws from it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from dew.commandline.console import console_script
from dew.commandline.exits import EXIT_BAD_INPUT
from dew.commandline.overrides import add_override_arguments, not_overrides
from dew.contract.typed import ConfigError


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="dew-sample", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("run_dir", help="the run directory (<trainer.checkpoint_dir>/<name>)")
    add_override_arguments(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="sample from this saved step (default: the best)")
    which.add_argument("--latest", action="store_true", help="sample from the latest saved step")
    p.add_argument(
        "--count",
        type=int,
        help="images per class, or text sequences (default: the objective's samples_per_class / samples knob)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of every draw (default 0)")
    p.add_argument(
        "--ema",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="sample with the EMA of the parameters (default: when the run kept one)",
    )
    p.add_argument("--steps", type=int, help="sampler steps (flow matching, masked diffusion)")
    p.add_argument("--guidance-scale", type=float, help="classifier-free guidance weight (images)")
    p.add_argument("--sampler", choices=("euler", "heun"), help="ODE solver (images)")
    p.add_argument("--temperature", type=float, help="logit temperature (text)")
    p.add_argument("--top-k", type=int, help="draw among the k most likely tokens; 0 keeps all (text)")
    p.add_argument("--prompt", help="text the sequences continue (next-token runs)")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        help="tokens drawn after the prompt (next-token runs; default: up "
        "to the model's seq_len; beyond it the context is a window that moves on by half its length)",
    )
    p.add_argument(
        "--out",
        help="the PNG grid or the text file (default: samples-step<N>-seed<S>.png or .txt in the run directory)",
    )
    p.add_argument("--npz", help="also write the images and their labels to this .npz (images)")
    args = p.parse_intermixed_args(argv)
    if bad := not_overrides(args.overrides):
        p.error(bad)
    for name in ("count", "steps", "max_new_tokens"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.temperature is not None and args.temperature <= 0:
        p.error("--temperature must be > 0")
    if args.top_k is not None and args.top_k < 0:
        p.error("--top-k must be >= 0")
    return args


@console_script
def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.cfg:
        from dew.inference.composing import print_config  # heavy: Hydra composes the config, --cfg alone

        sys.exit(print_config(args.run_dir, args.overrides, "dew-sample"))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import logging

    logging.getLogger("absl").setLevel(logging.ERROR)  # orbax reports reading one item as a warning
    # heavy: JAX, orbax and the model load only once the arguments are good (--help and a bad option stay instant)
    from dew.inference import drawing, restore

    try:
        drawing.run(args)
    except (restore.SampleError, ConfigError, FileNotFoundError, json.JSONDecodeError) as err:
        print(f"dew-sample: error: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


if __name__ == "__main__":
    main()
