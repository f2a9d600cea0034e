"""What the training dynamics cost (``trainer.dynamics_every``): the plain train step against a run
that reports them every ``--every`` steps, on the digits DiT and the tiny_lm transformer.

The shapes are conf/experiment/digits.yaml's (simple_dit, 8x8x1 images in 2x2 patches, width 128,
depth 4, 4 heads, batch 128) and conf/experiment/tiny_lm.yaml's (transformer, byte vocabulary,
seq_len 64, width 128, depth 4, 4 heads, batch 64), float32, adamw with the gradients clipped at 1.0
(the experiments' optimizer). The step is dew's own (``dew.training.step.make_train_step``), jitted
with the state donated as ``assembly.compile_train_step`` does it, in three programs:

- ``plain``: the step without dynamics, every step;
- ``two_programs``: what the loop runs: the plain program, and on every ``--every``-th step the
  second program, which also computes the dynamics (``dynamics=True``);
- ``cond``: the alternative, one program whose ``lax.cond`` on a step flag takes the dynamics branch
  on every ``--every``-th step (the other branch fills the same metrics with zeros, as a cond's two
  branches must return the same structure).

One process, in ``--rounds`` rounds alternating the three (their order rotating each round), each a
run of ``--every`` steps (so the dynamics once in each); a round's figure is its wall time per
step, and each ``*_vs_plain`` is the median over rounds of run / plain within the same round
(its range: the smallest and the largest round's). Each round also times ``--alone`` steps of the
second program alone (``dynamics``: every step reporting), the cost of one reporting step, whose
share of a run reporting every N steps is (dynamics_vs_plain - 1) / N: on shared cores the 100-step
runs vary by more than that share from round to round. Also:
the compile time of each program (``lower().compile()``, no compilation cache) and the time of one
dynamics step on its own. The last line is the JSON record.

    JAX_PLATFORMS=cpu python bench/dynamics.py                 # 100 steps a round, 5 rounds
    JAX_PLATFORMS=cpu python bench/dynamics.py --rounds 3 --models digits   # a quick look

(No smoke test in the suite: its six compilations take 40 s even at width 16.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dew.config import ModelConfig
from dew.data.tokenizer import BYTE_VOCAB
from dew.objectives.autoregressive import NextToken
from dew.objectives.flow_matching import FlowMatchingKnobs
from dew.objectives.next_token import NextTokenKnobs
from dew.objectives.rectified_flow import FlowMatching
from dew.training.step import TrainState, make_train_step

BLOCKS = {"hidden_size": 128, "depth": 4, "num_heads": 4}
"""The blocks of both experiments (conf/experiment/digits.yaml, tiny_lm.yaml)."""


def digits(blocks: dict, batch: int) -> tuple[Any, dict[str, jax.Array]]:
    """The digits DiT's objective and a batch of it."""
    fields = {**blocks, "patch_size": 2, "input_size": 8, "in_channels": 1, "num_classes": 10}
    objective = FlowMatching(ModelConfig("simple_dit", fields, dtype="float32"), FlowMatchingKnobs(), 10, (8, 8, 1))
    key = jax.random.PRNGKey(1)
    return objective, {"image": jax.random.normal(key, (batch, 8, 8, 1)), "label": jnp.arange(batch) % 10}


def tiny_lm(blocks: dict, batch: int, seq_len: int = 64) -> tuple[Any, dict[str, jax.Array]]:
    """The tiny_lm transformer's objective and a batch of it (random bytes)."""
    fields = {**blocks, "vocab_size": BYTE_VOCAB, "seq_len": seq_len}
    objective = NextToken(ModelConfig("transformer", fields, dtype="float32"), NextTokenKnobs(), BYTE_VOCAB, seq_len)
    return objective, {"tokens": jax.random.randint(jax.random.PRNGKey(1), (batch, seq_len + 1), 0, BYTE_VOCAB)}


MODELS = {"digits": (digits, 128), "tiny_lm": (tiny_lm, 64)}


def programs(objective: Any, batch: dict[str, jax.Array]) -> tuple[dict[str, Any], dict[str, float], Any]:
    """The compiled programs (``plain``, ``dynamics``, ``cond``), each one's compile seconds, and a
    fresh-state maker."""
    graphdef, params, rest = nnx.split(objective.build(nnx.Rngs(params=0)), nnx.Param, ...)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.0))

    def fresh() -> TrainState:
        state = TrainState.create(params, tx, seed=0, ema=False, dynamic_scale=False)
        return jax.tree.map(jnp.copy, state.replace(graphdef=graphdef, rest=rest))

    def step_of(dynamics: bool) -> Callable[..., tuple[TrainState, dict]]:
        lr = lambda s: jnp.asarray(1e-3)  # noqa: E731
        return make_train_step(
            objective, graphdef, rest, tx, lr, accumulation=1, dynamic_scale=False, dynamics=dynamics
        )

    plain, measuring = step_of(False), step_of(True)
    state = fresh()
    zeros = {k: jnp.zeros(v.shape, v.dtype) for k, v in jax.eval_shape(measuring, state, batch)[1].items()}

    def cond(state: TrainState, batch: dict[str, jax.Array], report: jax.Array) -> tuple[TrainState, dict]:
        def without(s: TrainState, b: dict[str, jax.Array]) -> tuple[TrainState, dict]:
            new, metrics = plain(s, b)
            return new, {**zeros, **metrics}

        return jax.lax.cond(report, measuring, without, state, batch)

    compiled, compile_s = {}, {}
    for name, fn, args in (
        ("plain", plain, (state, batch)),
        ("dynamics", measuring, (state, batch)),
        ("cond", cond, (state, batch, jnp.asarray(False))),
    ):
        start = time.perf_counter()
        compiled[name] = jax.jit(fn, donate_argnums=0).lower(*args).compile()
        compile_s[name] = time.perf_counter() - start
    return compiled, compile_s, fresh


def run(compiled: dict[str, Any], how: str, state: TrainState, batch: dict, steps: int, every: int) -> tuple:
    """``steps`` steps as ``how`` says (module docstring): (state, seconds per step)."""
    start = time.perf_counter()
    for s in range(1, steps + 1):
        report = s % every == 0
        if how == "cond":
            state, metrics = compiled["cond"](state, batch, jnp.asarray(report))
        elif how == "two_programs" and report:
            state, metrics = compiled["dynamics"](state, batch)
        else:
            state, metrics = compiled["plain"](state, batch)
    jax.block_until_ready(metrics)
    return state, (time.perf_counter() - start) / steps


def measure(name: str, args: argparse.Namespace) -> dict:
    """One model's record."""
    make, batch_size = MODELS[name]
    blocks = {"hidden_size": args.width, "depth": args.depth, "num_heads": 4}
    objective, batch = make(blocks, args.batch or batch_size)
    compiled, compile_s, fresh = programs(objective, batch)
    hows = ("plain", "two_programs", "cond")
    states = {how: fresh() for how in hows}
    for how in hows:  # warm-up: each program run (the cond's both branches): steps 1 and 2, reporting at 2
        states[how], _ = run(compiled, how, states[how], batch, 2, 2)
    per_step: dict[str, list[float]] = {how: [] for how in (*hows, "dynamics")}
    for r in range(args.rounds):
        for how in hows[r % 3 :] + hows[: r % 3]:
            states[how], seconds = run(compiled, how, states[how], batch, args.every, args.every)
            per_step[how].append(seconds)
        # a few steps of the second program alone, each reporting: what one reporting step costs
        states["two_programs"], seconds = run(compiled, "two_programs", states["two_programs"], batch, args.alone, 1)
        per_step["dynamics"].append(seconds)
    vs_plain = {
        how: [b / a for a, b in zip(per_step["plain"], per_step[how], strict=True)] for how in (*hows[1:], "dynamics")
    }
    return {
        "shape": {**blocks, "batch": args.batch or batch_size},
        "plain_ms": round(1000 * statistics.median(per_step["plain"]), 2),
        "dynamics_step_ms": round(1000 * statistics.median(per_step["dynamics"]), 2),
        **{f"{how}_vs_plain": round(statistics.median(vs_plain[how]), 4) for how in vs_plain},
        **{f"{how}_vs_plain_range": [round(min(vs_plain[how]), 4), round(max(vs_plain[how]), 4)] for how in vs_plain},
        "compile_s": {k: round(v, 2) for k, v in compile_s.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--every", type=int, default=100, help="trainer.dynamics_every: steps a round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--alone", type=int, default=5, help="steps of the second program alone, each round")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: digits,tiny_lm")
    p.add_argument("--width", type=int, default=BLOCKS["hidden_size"])
    p.add_argument("--depth", type=int, default=BLOCKS["depth"])
    p.add_argument("--batch", type=int, default=None, help="unset: each experiment's (128, 64)")
    args = p.parse_args(argv)
    models = {}
    for name in args.models.split(","):
        models[name] = r = measure(name, args)
        print(
            f"{name}: plain {r['plain_ms']} ms/step; dynamics every {args.every}: two programs "
            f"{100 * (r['two_programs_vs_plain'] - 1):+.2f}% {r['two_programs_vs_plain_range']}, lax.cond "
            f"{100 * (r['cond_vs_plain'] - 1):+.2f}% {r['cond_vs_plain_range']}; a reporting step "
            f"{r['dynamics_step_ms']} ms ({r['dynamics_vs_plain']:.3f}x plain, {r['dynamics_vs_plain_range']}); "
            f"compile s {r['compile_s']}",
            flush=True,
        )
    record = {
        "bench": "dynamics",
        "every": args.every,
        "rounds": args.rounds,
        "device": jax.devices()[0].device_kind,
        "models": models,
    }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
