"""Time and memory of a training step under each rematerialisation policy (``model.config.remat``).

One process builds the transformer and the DiT at CPU-sized shapes, compiles a jitted, donated
value_and_grad + adamw step per policy, and times them in interleaved rounds (the policy order
rotating each round): wall time and process CPU time per step, median over rounds, and the compiled
step's temporary memory (``memory_analysis().temp_size_in_bytes``). Each ratio is against ``none``
within the same round.

    JAX_PLATFORMS=cpu python bench/remat.py [--steps 10 --rounds 5]

The last line printed is JSON: {"bench": "remat", ...}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dew.contract.models import build

POLICIES = ("none", "full", "dots", "minimal", "minimal_with_context")
MODELS = {
    # A 4-layer 256-wide LM at T=256 and a DiT-S-like stack on 32x32x4 latents (256 patches).
    "transformer": (dict(vocab_size=4096, seq_len=256, hidden_size=256, depth=4, num_heads=4), 8),
    "simple_dit": (dict(input_size=32, in_channels=4, hidden_size=256, depth=4, num_heads=4, num_classes=10), 8),
}


def make_step(arch: str, fields: dict, batch: int, remat: str):
    """A compiled train step of ``arch`` under ``remat``, its state, its inputs and its temp bytes."""
    model = build(arch, {**fields, "remat": remat}, nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    key = jax.random.key(1)
    if arch == "transformer":
        inputs = (jax.random.randint(key, (batch, fields["seq_len"]), 0, fields["vocab_size"]),)
    else:
        side = fields["input_size"]
        inputs = (
            jax.random.normal(key, (batch, side, side, fields["in_channels"])),
            jnp.linspace(0, 1, batch),
            jnp.arange(batch) % fields["num_classes"],
        )
    tx = optax.adamw(1e-4)

    def step(params, opt_state, inputs):
        def loss(p):
            return jnp.mean(nnx.merge(graphdef, p)(*inputs).astype(jnp.float32) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    opt_state = tx.init(params)
    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, opt_state, inputs).compile()
    return compiled, [params, opt_state], inputs, compiled.memory_analysis().temp_size_in_bytes


def time_steps(entry, steps: int) -> tuple[float, float]:
    """Wall and process-CPU seconds per step over ``steps`` steps."""
    compiled, state, inputs, _ = entry
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        state[0], state[1], loss = compiled(state[0], state[1], inputs)
    jax.block_until_ready(loss)
    return (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="steps timed per policy per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: transformer,simple_dit")
    args = parser.parse_args()

    results = {}
    for arch in args.models.split(","):
        fields, batch = MODELS[arch]
        entries = {p: make_step(arch, fields, batch, p) for p in POLICIES}
        for entry in entries.values():
            time_steps(entry, 2)  # warm-up
        wall = {p: [] for p in POLICIES}
        cpu = {p: [] for p in POLICIES}
        for r in range(args.rounds):
            order = POLICIES[r % len(POLICIES) :] + POLICIES[: r % len(POLICIES)]
            for p in order:
                w, c = time_steps(entries[p], args.steps)
                wall[p].append(w)
                cpu[p].append(c)
        rows = {}
        for p in POLICIES:
            wall_ratio = [b / a for a, b in zip(wall["none"], wall[p], strict=True)]
            cpu_ratio = [b / a for a, b in zip(cpu["none"], cpu[p], strict=True)]
            rows[p] = {
                "temp_mib": round(entries[p][3] / 2**20, 2),
                "wall_ms": round(1000 * statistics.median(wall[p]), 1),
                "cpu_ms": round(1000 * statistics.median(cpu[p]), 1),
                "wall_vs_none": round(statistics.median(wall_ratio), 3),
                "wall_vs_none_range": [round(min(wall_ratio), 3), round(max(wall_ratio), 3)],
                "cpu_vs_none": round(statistics.median(cpu_ratio), 3),
                "cpu_vs_none_range": [round(min(cpu_ratio), 3), round(max(cpu_ratio), 3)],
            }
            print(
                f"{arch:12s} {p:21s} temp {rows[p]['temp_mib']:8.1f} MiB  wall {rows[p]['wall_ms']:7.1f} ms "
                f"({rows[p]['wall_vs_none']:.3f}x none, {rows[p]['wall_vs_none_range']})  cpu "
                f"{rows[p]['cpu_ms']:7.1f} ms ({rows[p]['cpu_vs_none']:.3f}x, {rows[p]['cpu_vs_none_range']})",
                flush=True,
            )
        results[arch] = {"fields": fields, "batch": batch, "policies": rows}
    print(
        json.dumps(
            {
                "bench": "remat",
                "rounds": args.rounds,
                "steps": args.steps,
                "device": jax.devices()[0].device_kind,
                "models": results,
            }
        )
    )


if __name__ == "__main__":
    main()
