"""dew's trainer against MaxText's on the same decoder-only transformer: tokens/s ratio per round.

The same model on both sides: 4 pre-norm blocks of width 256 (RMSNorm, rotary embeddings, 4 query
and 4 key/value heads of 64, SwiGLU MLP 768 wide, no biases), untied embeddings and output head,
vocabulary 4,096, T=256, batch 8, float32 parameters and compute, XLA dot-product attention, adamw
(weight decay 0.1) with gradient clipping at global norm 1, no dropout, no EMA, one synthetic batch.
dew's side is ``RunConfig.train`` (its default ``remat=minimal_with_context``); MaxText's is its own
``train.py`` loop with the ``llama2`` decoder block, at its default ``remat_policy=full`` and at the
policy its base.yml lists as fastest, ``minimal_with_context`` (``--maxtext-remats`` names others).

Each side runs in its own process, one after the other, in interleaved rounds (the order rotating
each round): MaxText in its own environment (``--maxtext-python``: it pins its own jax, flax and
optax, so it does not share dew's), dew in this interpreter's. Every side's time is the wall time
and process CPU time of ``--steps`` steps after ``--warmup`` (compilation) steps, taken at a device
sync after the warm-up's last step and after the last step: dew's by bench/_loops.py's
``trainer_loop``, MaxText's by wrapping its ``training_loop_iteration``. Both processes see the
same environment (``XLA_FLAGS``, ``JAX_PLATFORMS``). The ratio of a round is dew's tokens/s over
MaxText's: against its default (``ratio_vs_default``) and against its fastest side in that round
(``ratio_vs_best``); ``cpu_ratio_*`` are the same in CPU seconds per step (MaxText's over dew's).

    python -m venv mt-venv && mt-venv/bin/pip install maxtext==0.2.5
    mt-venv/bin/pip install -r "$(mt-venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/dependencies/requirements/generated_requirements/decoupled-requirements.txt"
    JAX_PLATFORMS=cpu python bench/maxtext_parity.py --maxtext-python mt-venv/bin/python [--rounds 5 --steps 10 --warmup 3]

Without MaxText (no such interpreter, or ``import maxtext`` fails in it) it says what is missing and
records ``"skipped"``. The last line printed is JSON: {"bench": "maxtext_parity", ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL = dict(vocab_size=4096, seq_len=256, hidden_size=256, depth=4, num_heads=4, num_kv_heads=4, mlp_hidden=768)
BATCH = 8
INSTALL = (
    "install it in its own environment: python -m venv mt-venv && mt-venv/bin/pip install maxtext==0.2.5 "
    "and its decoupled-requirements.txt (docs/performance.md, 'Parity with MaxText'), then pass "
    "--maxtext-python mt-venv/bin/python or set MAXTEXT_PYTHON"
)


def maxtext_overrides(remat: str, steps: int, out: Path) -> list[str]:
    """MaxText's base.yml overrides for the model and run above."""
    m = MODEL
    return [
        "run_name=parity",
        f"base_output_directory={out}",
        "skip_jax_distributed_system=true",
        "enable_checkpointing=false",
        "dataset_type=synthetic",
        "packing=false",
        "decoder_block=llama2",
        f"base_emb_dim={m['hidden_size']}",
        f"base_num_query_heads={m['num_heads']}",
        f"base_num_kv_heads={m['num_kv_heads']}",
        f"base_mlp_dim={m['mlp_hidden']}",
        f"base_num_decoder_layers={m['depth']}",
        f"head_dim={m['hidden_size'] // m['num_heads']}",
        f"vocab_size={m['vocab_size']}",
        f"max_target_length={m['seq_len']}",
        f"per_device_batch_size={BATCH}",
        "logits_via_embedding=false",
        "attention=dot_product",
        "dtype=float32",
        "weight_dtype=float32",
        "opt_type=adamw",
        "adam_weight_decay=0.1",
        "gradient_clipping_threshold=1.0",
        "enable_dropout=false",
        f"remat_policy={remat}",
        f"steps={steps}",
        "jax_cache_dir=",
        "enable_tensorboard=false",
        "enable_goodput_recording=false",
        "monitor_goodput=false",
        "log_config=false",
        "log_period=1000000",
    ]


def maxtext_side(remat: str, steps: int, warmup: int) -> tuple[float, float]:
    """Runs MaxText's train loop (in MaxText's environment) and times steps ``warmup``..end."""
    import jax
    import maxtext
    from absl import app
    from maxtext.trainers.pre_train import train

    marks: list[tuple[float, float]] = []
    original = train.training_loop_iteration

    def timed(jax_device_state, python_vars, immutable_data):
        step = python_vars["step"]
        metrics = original(jax_device_state, python_vars, immutable_data)
        if step in (warmup - 1, warmup + steps - 1):
            jax.block_until_ready(jax_device_state["state"])
            marks.append((time.perf_counter(), time.process_time()))
        return metrics

    train.training_loop_iteration = timed
    config = Path(maxtext.__file__).parent / "configs" / "base.yml"
    with tempfile.TemporaryDirectory() as tmp:
        try:  # as MaxText's own entry point runs it: absl's flags and INFO log (each step's seconds)
            app.run(train.main, argv=["train", str(config), *maxtext_overrides(remat, warmup + steps, Path(tmp))])
        except SystemExit as stop:
            if stop.code:
                raise
    (wall0, cpu0), (wall1, cpu1) = marks
    return wall1 - wall0, cpu1 - cpu0


def dew_side(steps: int, warmup: int) -> tuple[float, float]:
    """Runs dew's trainer on the same model and times steps ``warmup``..end (bench/_loops.py)."""
    from _loops import Synthetic, trainer_loop  # bench/ is the script's directory, first on sys.path

    from dew.build import build_objective, resolve
    from dew.contract.config import ModelConfig, OptimConfig, TrainerConfig
    from dew.objectives.next_token import NextTokenKnobs
    from dew.recipe import Recipe

    data = Synthetic("transformer", MODEL, BATCH)
    fields = {k: v for k, v in MODEL.items() if k not in data.fields}
    with tempfile.TemporaryDirectory() as tmp:
        run = Recipe(
            model=ModelConfig(
                architecture="transformer",
                config={**fields, "tie_embeddings": False},
                dtype="float32",
                attention_impl="xla",
            ),
            optim=OptimConfig(optimizer="adamw", weight_decay=0.1, clip_grads=1.0),
            trainer=TrainerConfig(
                checkpoint_dir=tmp,
                batch_size=BATCH,
                steps=warmup + steps,
                log_every=warmup,
                eval_every=None,
                checkpoint_every=None,
                compilation_cache_dir=None,
                multi_host=False,
            ),
            next_token=NextTokenKnobs(ema_decay=0.0),
        )
        run = resolve(run, data)
        return trainer_loop(run, build_objective(run, data), data, steps, warmup, "parity")


def probe(python: str) -> tuple[str | None, str]:
    """MaxText's version in ``python``'s environment, or None and what is missing."""
    if not Path(python).is_file():
        return None, f"no MaxText: no Python at --maxtext-python {python}"
    proc = subprocess.run(
        [python, "-c", "import maxtext; print(maxtext.__version__)"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    if proc.returncode:
        return None, f"no MaxText: 'import maxtext' fails in {python} ({proc.stderr.strip().splitlines()[-1:]})"
    return proc.stdout.strip(), ""


def run_side(side: str, python: str, args) -> dict:
    """One side in its own process: its wall and CPU seconds, and MaxText's own per-step log."""
    cmd = [
        python,
        str(Path(__file__).resolve()),
        "--side",
        side,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
    ]
    env = dict(os.environ)
    if side == "dew":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    else:  # MaxText's environment, nothing of dew's
        env.pop("PYTHONPATH", None)
        env["DECOUPLE_GCLOUD"] = "TRUE"
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    try:
        record = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        record = None
    if proc.returncode or not isinstance(record, dict):
        sys.exit(f"maxtext_parity: the {side} side failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    # MaxText logs each step's seconds itself (dispatch to dispatch): a check on the wrapper's window.
    logged = [
        float(s)
        for n, s in re.findall(r"completed step: (\d+), seconds: ([\d.]+)", proc.stderr)
        if int(n) >= args.warmup
    ]
    if logged:
        record["logged_step_s"] = statistics.median(logged)
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--maxtext-python",
        default=os.environ.get("MAXTEXT_PYTHON", "/work/mt-venv/bin/python"),
        help="the Python of MaxText's environment ($MAXTEXT_PYTHON)",
    )
    parser.add_argument(
        "--maxtext-remats",
        default="full,minimal_with_context",
        help="MaxText remat_policy settings to run, comma-separated; the first is its default",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="steps timed per side per round")
    parser.add_argument("--warmup", type=int, default=3, help="steps run before the timed ones, per side")
    parser.add_argument("--side", default=None, help=argparse.SUPPRESS)  # dew | maxtext:<remat>, in a child
    args = parser.parse_args()

    if args.side is not None:  # a child: one side, its seconds as the last line
        if args.side == "dew":
            wall, cpu = dew_side(args.steps, args.warmup)
        else:
            wall, cpu = maxtext_side(args.side.split(":", 1)[1], args.steps, args.warmup)
        print(json.dumps({"wall_s": wall, "cpu_s": cpu}), flush=True)
        return 0

    version, missing = probe(args.maxtext_python)
    if version is None:
        print(f"maxtext_parity: skipped: {missing}; {INSTALL}")
        print(json.dumps({"bench": "maxtext_parity", "skipped": missing}))
        return 0

    remats = args.maxtext_remats.split(",")
    sides = ["dew", *(f"maxtext:{r}" for r in remats)]
    tokens = args.steps * BATCH * MODEL["seq_len"]
    per_side = {s: [] for s in sides}
    rounds = []
    for r in range(args.rounds):
        order = sides[r % len(sides) :] + sides[: r % len(sides)]
        for side in order:
            python = sys.executable if side == "dew" else args.maxtext_python
            per_side[side].append(run_side(side, python, args))
        got = {s: per_side[s][-1] for s in sides}
        mt = {s: got[s] for s in sides[1:]}
        best = min(mt, key=lambda s: mt[s]["wall_s"])
        best_cpu = min(mt, key=lambda s: mt[s]["cpu_s"])
        rounds.append(
            {
                "order": order,
                "best": best,
                "tokens_per_sec": {s: tokens / got[s]["wall_s"] for s in sides},
                "cpu_ms_per_step": {s: 1000 * got[s]["cpu_s"] / args.steps for s in sides},
                "ratio_vs_default": mt[sides[1]]["wall_s"] / got["dew"]["wall_s"],
                "ratio_vs_best": mt[best]["wall_s"] / got["dew"]["wall_s"],
                "cpu_ratio_vs_default": mt[sides[1]]["cpu_s"] / got["dew"]["cpu_s"],
                "cpu_ratio_vs_best": mt[best_cpu]["cpu_s"] / got["dew"]["cpu_s"],
            }
        )
        print(
            f"round {r}: "
            + ", ".join(
                f"{s} {rounds[-1]['tokens_per_sec'][s]:.0f} tok/s ({rounds[-1]['cpu_ms_per_step'][s]:.0f} CPU ms/step)"
                for s in sides
            )
            + f"; dew/MaxText default {rounds[-1]['ratio_vs_default']:.3f}, "
            f"dew/MaxText best ({best}) {rounds[-1]['ratio_vs_best']:.3f}",
            flush=True,
        )

    record = {
        "bench": "maxtext_parity",
        "maxtext_version": version,
        "maxtext_remats": remats,
        "model": MODEL,
        "batch": BATCH,
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
    }
    for key in ("ratio_vs_default", "ratio_vs_best", "cpu_ratio_vs_default", "cpu_ratio_vs_best"):
        values = [x[key] for x in rounds]
        record[key] = round(statistics.median(values), 3)
        record[f"{key}_range"] = [round(min(values), 3), round(max(values), 3)]
        record[f"{key}_rounds"] = [round(v, 3) for v in values]
    record["tokens_per_sec"] = {s: round(statistics.median(x["tokens_per_sec"][s] for x in rounds)) for s in sides}
    record["cpu_ms_per_step"] = {s: round(statistics.median(x["cpu_ms_per_step"][s] for x in rounds), 1) for s in sides}
    record["maxtext_logged_step_ms"] = {
        s: round(1000 * statistics.median(x["logged_step_s"] for x in per_side[s]), 1)
        for s in sides[1:]
        if all("logged_step_s" in x for x in per_side[s])
    }
    record["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
