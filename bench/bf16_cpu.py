"""bfloat16 against float32 compute on the CPU backend: one training step of the digits experiment's
model (the README run's DiT, batch 128) in each dtype, in one process, interleaved round by round.

CPUs have no bfloat16 matmul units that XLA's CPU backend uses here, so a bfloat16 model converts
around every matmul; this measures what that costs, for the warning a run prints when its compute
dtype is emulated (dew.training.reporting.summary).

    JAX_PLATFORMS=cpu python bench/bf16_cpu.py [--rounds 5 --steps 10 --batch 128]

The last line printed is JSON: {"bench": "bf16_cpu", "slowdown": bf16 time / f32 time, ...}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import optax
from flax import nnx
from trainer_overhead import compose  # bench/ is the script's directory, first on sys.path


def make_step(dtype: str, batch_size: int):
    """A jitted value_and_grad + adamw step of the digits DiT computing in ``dtype``, its state and
    a batch."""
    from dew.build import build_run

    recipe = compose(
        "experiment=digits",
        f"model.dtype={dtype}",
        f"trainer.batch_size={batch_size}",
        "trainer.compilation_cache_dir=null",
    )
    recipe, objective, dataset = build_run(recipe)
    graphdef, params, rest = nnx.split(objective.build(nnx.Rngs(params=0)), nnx.Param, ...)
    tx = optax.adamw(1e-3)

    def step(params, opt_state, key, batch):
        def loss_fn(p):
            out = objective.loss(nnx.merge(graphdef, p, rest), batch, key)
            return out.total / out.count

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step), params, tx.init(params), dataset.iterator().next(batch_size)


def timed(step, params, opt_state, batch, steps: int) -> float:
    key = jax.random.PRNGKey(0)
    start = time.perf_counter()
    for i in range(steps):
        params, opt_state, loss = step(params, opt_state, jax.random.fold_in(key, i), batch)
    jax.block_until_ready(loss)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    sides = {dtype: make_step(dtype, args.batch) for dtype in ("float32", "bfloat16")}
    for side in sides.values():
        timed(*side, steps=2)  # compile
    times: dict[str, list[float]] = {d: [] for d in sides}
    for r in range(args.rounds):
        for dtype in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            times[dtype].append(timed(*sides[dtype], steps=args.steps))
    ratios = [b / f for b, f in zip(times["bfloat16"], times["float32"])]
    result = {
        "bench": "bf16_cpu",
        "backend": jax.default_backend(),
        "batch": args.batch,
        "float32_ms": 1e3 * statistics.median(times["float32"]),
        "bfloat16_ms": 1e3 * statistics.median(times["bfloat16"]),
        "slowdown": statistics.median(ratios),
    }
    print(f"float32 {result['float32_ms']:.1f} ms/step, bfloat16 {result['bfloat16_ms']:.1f} ms/step")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
