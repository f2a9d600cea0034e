"""dew-eval: a run's model measured on a dataset's held-out split, without training.

    dew-eval RUN                                   the best checkpoint on the run's own held-out split
    dew-eval RUN --step 500 --ema                  a saved step's EMA of the parameters
    dew-eval RUN data.val_path=other.bin           another file as the held-out split
    dew-eval RUN data=token_windows data.path=...  another dataset, in dew-train's config groups
    dew-eval HF_DIR data=token_windows data.path=...   a Hugging Face Llama directory
    dew-eval RUN --tasks-only 'trainer.evals={tasks: [{name: hs, path: hs.jsonl}]}'   downstream tasks alone
    dew-eval RUN --follow --tasks-only             every new checkpoint once, until the run ends
    dew-eval RUN --follow --launch slurm hydra.launcher.partition=gpu   the follower as a SLURM job

The values are the trainer's evaluation (the objective's loss and the metrics dew-train evaluates it
with; for a next-token model on text, the perplexity and bits per byte too; the downstream tasks of
trainer.evals, scored as lm-evaluation-harness scores them: docs/eval.md), printed as a table and
written as JSON to RUN/eval/step<N>[-ema]-<data>[-<digest of the overrides>].json (--out to choose).
Nothing else of the run is touched. A bad input ends with one line and exit status 2
(DEW_DEBUG=1 shows the traceback). Across processes and on a mesh as training runs (trainer.mesh,
trainer.multi_host); overrides are dew-train's (a field, or a group's option: data, model, optim,
optim/schedule, trainer).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from dew.commandline.console import console_script
from dew.commandline.exits import EXIT_BAD_INPUT, debugging
from dew.commandline.overrides import add_override_arguments, not_overrides


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="dew-eval",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    p.add_argument("run", help="the run directory (<trainer.checkpoint_dir>/<name>) or a Hugging Face Llama directory")
    add_override_arguments(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="evaluate this saved step (default: the best)")
    which.add_argument("--latest", action="store_true", help="evaluate the latest saved step")
    p.add_argument(
        "--ema",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="evaluate the EMA of the parameters (default: the parameters, which the trainer's eval/loss measures)",
    )
    p.add_argument("--out", help="the JSON file to write (default: RUN/eval/<step>-<data>.json)")
    p.add_argument(
        "--tasks-only",
        action="store_true",
        help="score the downstream tasks of trainer.evals alone, not the held-out split",
    )
    p.add_argument(
        "--follow",
        action="store_true",
        help="evaluate every checkpoint of RUN once as it appears, until the run ends (resumable)",
    )
    p.add_argument("--poll", type=float, default=30.0, help="--follow: seconds between looks for new checkpoints")
    p.add_argument(
        "--launch",
        choices=("local", "slurm"),
        help="--follow: submit the follower as a job of its own under this launch profile "
        "(launch/hydra/launcher/<profile>.yaml; its fields as hydra.launcher.FIELD=VALUE) and return",
    )
    args = p.parse_intermixed_args(argv)
    if bad := not_overrides(args.overrides):
        p.error(bad)
    if args.follow and (args.step is not None or args.latest or args.out):
        p.error("--follow evaluates every step, each into its own file: it takes no --step, --latest or --out")
    if args.launch and not args.follow:
        p.error(f"--launch {args.launch} submits a follower: it goes with --follow")
    if args.poll <= 0:
        p.error(f"--poll {args.poll}: must be a positive number of seconds")
    return args


@console_script
def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.cfg:
        from dew.inference.composing import print_config  # heavy: Hydra composes the config, --cfg alone

        sys.exit(print_config(args.run, args.overrides, "dew-eval"))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import logging

    logging.getLogger("absl").setLevel(logging.ERROR)  # orbax reports reading one item as a warning
    # heavy: JAX, orbax and the model load only once the arguments are good (--help and a bad option stay instant)
    from dew.contract.typed import ConfigError
    from dew.inference import evaluating
    from dew.inference.composing import EvalError

    try:
        if args.follow:
            from dew.inference import following

            if args.launch:
                launch_follower(args)
            else:
                following.follow(args)
            return
        result, written = evaluating.run(args)
    except (EvalError, ConfigError, ValueError, OSError) as err:  # a bad input, as dew-train reads one
        if debugging():  # HYDRA_FULL_ERROR=1 or DEW_DEBUG=1: the traceback
            raise
        print(f"dew-eval: error: {' '.join(str(err).split())}", file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_INPUT)
    except KeyboardInterrupt:  # nothing is half-written: the results file is renamed into place whole
        print("dew-eval: interrupted", file=sys.stderr, flush=True)
        sys.exit(130)
    evaluating.report(result, written)


def launch_follower(args: argparse.Namespace) -> None:
    """``--follow --launch PROFILE``: the follower submitted as a job of its own (dew.launching.followers)."""
    from dew.inference import following
    from dew.inference.evaluating import EVAL_DIR
    from dew.launching import followers

    own, profile = followers.split_overrides(args.overrides)
    if (busy := following.followed(args.run)) is not None:
        raise busy
    fields = followers.profile(args.launch, profile)
    run = os.path.abspath(args.run)
    job = following.FollowJob(argparse.Namespace(**{**vars(args), "overrides": own}))
    name = f"{os.path.basename(run)}-follow"
    submitted = followers.submit(job, args.launch, fields, os.path.join(run, EVAL_DIR, "follow-jobs"), name)
    if submitted is not None:
        print(f"dew-eval: following {run} as {args.launch} job {submitted.job_id} (log: {submitted.paths.stdout})")


if __name__ == "__main__":
    main()
