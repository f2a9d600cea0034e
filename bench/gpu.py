"""The GPU check: matmul ceiling, dew against a bare ``jax.jit`` loop, MFU, attention kernels and the
asynchronous checkpoint, one JSON line per measurement.

Models (bfloat16 compute, float32 parameters, adamw, EMA off on both sides since the bare loop has
none): simple_dit DiT-B/2 and DiT-XL/2 on 32x32x4 latents with 1,000 classes (flow matching), and a
124M-parameter next-token transformer (12 x 768, vocabulary 50,304) at T=1024. Each runs with
``attention_impl`` xla and cudnn, through ``RunConfig.train`` and through a bare jitted, donated
value_and_grad + optax step on the same objective, batch and optimizer; the data is one synthetic
batch held in host memory and handed to both sides every step, so the input pipeline is out of it.
``--remat`` builds every model of both sides with one rematerialisation policy (each step line
records the policy it ran; by default the models' own, ``minimal_with_context``). A side's time is
taken between the end of ``--warmup`` steps and the last step (the trainer's by the wall time
between the tracker receiving those two steps' metrics, as bench/trainer_overhead.py does). MFU is
training FLOPs (``dew.models.flops``) per second over the bf16 matmul ceiling measured here first,
and over the data sheet's peak (``dew.training.reporting.tracker.PEAK_FLOPS``) where it names the
device. Last, the blocking time of an asynchronous save of DiT-XL/2's full train state.

On the GPU machine (jax with CUDA installed, no package index), from a checkout carrying the
wheelhouse bench/gpu_wheels.sh built:

    pip install --no-index --find-links wheels -r wheels/requirements.txt && python bench/gpu.py --out gpu.jsonl

On a CPU the same script runs at toy shapes (``--smoke``; tests/bench/test_gpu_smoke.py), the cudnn
combinations recorded as skipped with the reason.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, get_args

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

if __package__:  # imported as bench.gpu (tests/bench)
    from bench._loops import Synthetic, bare_loop, trainer_loop
else:  # run as a script: bench/ is first on sys.path, and dew is the checkout's (not installed on a GPU machine)
    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
    from _loops import Synthetic, bare_loop, trainer_loop

# name -> (architecture, fields, batch, timed steps); the smoke shapes keep every code path.
CASES: dict[str, tuple[str, dict[str, Any], int, int]] = {
    "lm_124m": ("transformer", dict(vocab_size=50304, seq_len=1024, hidden_size=768, depth=12, num_heads=12), 32, 30),
    "dit_b2": (
        "simple_dit",
        dict(input_size=32, in_channels=4, num_classes=1000, hidden_size=768, depth=12, num_heads=12, patch_size=2),
        256,
        30,
    ),
    "dit_xl2": (
        "simple_dit",
        dict(input_size=32, in_channels=4, num_classes=1000, hidden_size=1152, depth=28, num_heads=16, patch_size=2),
        256,
        15,
    ),
}
SMOKE: dict[str, tuple[str, dict[str, Any], int, int]] = {
    "lm_124m": ("transformer", dict(vocab_size=128, seq_len=32, hidden_size=32, depth=1, num_heads=2), 4, 2),
    "dit_b2": (
        "simple_dit",
        dict(input_size=8, in_channels=4, num_classes=10, hidden_size=32, depth=1, num_heads=2, patch_size=2),
        4,
        2,
    ),
    # dit_b2's shapes: the smoke's checkpoint record (dit_xl2's state) then builds its model from the
    # initialisation ops dit_b2's runs compiled eagerly (a second depth, 2, compiled them all again:
    # the checkpoint 1.4-1.6 -> 0.4 CPU-s); the blocks are one scanned stack at any depth
    "dit_xl2": (
        "simple_dit",
        dict(input_size=8, in_channels=4, num_classes=10, hidden_size=32, depth=1, num_heads=2, patch_size=2),
        4,
        2,
    ),
}
IMPLS = ("xla", "cudnn")


def emit(record: dict[str, Any], out: Path | None) -> None:
    line = json.dumps({"bench": "gpu", **record})
    print(line, flush=True)
    if out is not None:
        with out.open("a") as f:
            f.write(line + "\n")


def datasheet_peak(dtype: str) -> float | None:
    """The data sheet's FLOP/s of this process's devices, None for a device the table does not name
    (no measured fallback here: the measured ceiling is its own record)."""
    from dew.training.reporting.tracker import PEAK_FLOPS

    kind = jax.devices()[0].device_kind
    for prefix in sorted(PEAK_FLOPS, key=len, reverse=True):
        if kind.startswith(prefix):
            return PEAK_FLOPS[prefix]["float32" if dtype == "float32" else "16bit"] * jax.device_count()
    return None


def matmul_ceiling(side: int, repeats: int) -> float:
    """Best bf16 FLOP/s of a jitted ``side``-square matmul chain over all local devices' first one."""
    a = jax.random.normal(jax.random.key(0), (side, side), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (side, side), jnp.bfloat16)
    chain = 8  # matmuls per call, so the launch overhead is amortised

    @jax.jit
    def run(a, b):
        for _ in range(chain):
            a = (a @ b).astype(jnp.bfloat16)
        return a

    run(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return chain * 2 * side**3 / best


def recipe(arch: str, fields: dict[str, Any], batch: int, impl: str, steps: int, warmup: int, work: Path):
    """The run both sides train, and its objective, resolved against the synthetic data."""
    from dew.build import build_objective, resolve
    from dew.contract.config import ModelConfig, TrainerConfig
    from dew.objectives.flow_matching import FlowMatchingKnobs
    from dew.objectives.next_token import NextTokenKnobs
    from dew.recipe import Recipe

    data = Synthetic(arch, fields, batch)
    model_fields = {k: v for k, v in fields.items() if k not in data.fields}
    run = Recipe(
        model=ModelConfig(architecture=arch, config=model_fields, dtype="bfloat16", attention_impl=impl),
        trainer=TrainerConfig(
            checkpoint_dir=str(work / "runs"),
            batch_size=batch,
            steps=warmup + steps,
            log_every=warmup,
            eval_every=None,
            checkpoint_every=None,
            compilation_cache_dir=None,
            multi_host=False,
        ),
        flow_matching=FlowMatchingKnobs(ema_decay=0.0),
        next_token=NextTokenKnobs(ema_decay=0.0),
    )
    run = resolve(run, data)
    return run, build_objective(run, data), data


def checkpoint_blocking(run, objective, saves: int, work: Path) -> dict[str, float]:
    """Blocking and total seconds of asynchronous saves of the full train state (parameters and adamw
    state), as ``dew.training.checkpointing.checkpoints.Checkpoints`` saves it in the loop."""
    from dew.training.checkpointing.checkpoints import Checkpoints
    from dew.training.optim.build import build_optimizer

    params = nnx.state(objective.build(nnx.Rngs(params=0)), nnx.Param)
    state = jax.block_until_ready(
        {"params": params, "opt": build_optimizer(run.optim, params, total_steps=10).tx.init(params)}
    )
    ckpts = Checkpoints(work / "ckpt", keep=1)
    blocking, total = [], []
    for i in range(saves + 1):  # the first save sets orbax's handlers up: not counted
        start = time.perf_counter()
        ckpts.save(i + 1, state, {"step": i + 1}, metrics=None)
        blocking.append(time.perf_counter() - start)
        ckpts.wait()
        total.append(time.perf_counter() - start)
    ckpts.close()
    size = sum(x.nbytes for x in jax.tree.leaves(state))
    return {
        "state_gib": size / 2**30,
        "blocking_ms": 1000 * float(np.median(blocking[1:])),
        "total_ms": 1000 * float(np.median(total[1:])),
    }


def main(argv: list[str] | None = None) -> int:
    from dew.contract.models import resolve_fields
    from dew.contract.registry import RematPolicy

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="toy shapes, for a CPU (the test suite)")
    parser.add_argument("--out", type=Path, default=None, help="also append the JSON lines to this file")
    parser.add_argument("--cases", default=None, help=f"comma-separated subset of {', '.join(CASES)}")
    parser.add_argument("--warmup", type=int, default=None, help="steps before the timed ones (5; smoke 1)")
    parser.add_argument(
        "--remat",
        choices=get_args(RematPolicy),
        default=None,
        help="every model's rematerialisation policy, on both sides (default: the model's own, minimal_with_context)",
    )
    args = parser.parse_args(argv)
    logging.getLogger("absl").setLevel(logging.WARNING)
    cases = SMOKE if args.smoke else CASES
    names = args.cases.split(",") if args.cases else list(cases)
    unknown = [n for n in names if n not in cases]
    if unknown:
        parser.error(f"--cases: unknown {', '.join(unknown)}; known: {', '.join(cases)}")
    warmup = args.warmup or (1 if args.smoke else 5)
    device = {"device": jax.devices()[0].device_kind, "devices": jax.device_count(), "backend": jax.default_backend()}

    ceiling = matmul_ceiling(256 if args.smoke else 8192, 3 if args.smoke else 20)
    sheet = datasheet_peak("bfloat16")
    emit(
        {
            "measure": "matmul_ceiling",
            "dtype": "bfloat16",
            "tflops": ceiling / 1e12,
            "datasheet_tflops": sheet and sheet / 1e12,
            **device,
        },
        args.out,
    )

    from dew.models.attention import cudnn_obstacles
    from dew.models.flops import flops_per_example

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in names:
            arch, fields, batch, steps = cases[name]
            if args.remat is not None:
                fields = {**fields, "remat": args.remat}
            for impl in IMPLS:
                base = {"measure": "step", "model": name, "attention_impl": impl, "batch": batch, **device}
                head_dim = fields["hidden_size"] // fields["num_heads"]
                obstacles = cudnn_obstacles(jnp.bfloat16, head_dim) if impl == "cudnn" else []
                if obstacles:
                    emit({**base, "skipped": "; ".join(obstacles)}, args.out)
                    continue
                run, objective, data = recipe(arch, fields, batch, impl, steps, warmup, work)
                flops = flops_per_example(arch, run.model.fields())
                for side in ("bare", "dew"):
                    seconds, _ = (
                        bare_loop(objective, run.optim, data, steps, warmup)
                        if side == "bare"
                        else trainer_loop(run, objective, data, steps, warmup, f"{name}-{impl}")
                    )
                    rate = steps * batch / seconds
                    emit(
                        {
                            **base,
                            "side": side,
                            "step_ms": 1000 * seconds / steps,
                            "examples_per_sec": rate,
                            "mfu_vs_ceiling": rate * flops / ceiling,
                            "mfu_vs_datasheet": sheet and rate * flops / sheet,
                            "flops_per_example": flops,
                            "remat": resolve_fields(arch, run.model.fields()).remat,  # as built, both sides
                        },
                        args.out,
                    )
        arch, fields, batch, _ = cases["dit_xl2"]
        run, objective, _ = recipe(arch, fields, batch, "xla", 1, 1, work)
        emit(
            {"measure": "checkpoint", "model": "dit_xl2", **device, **checkpoint_blocking(run, objective, 2, work)},
            args.out,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
