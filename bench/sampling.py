"""Text sampling speed: next-token decoding with and without the key/value cache, and the cost of a
masked-diffusion sampling step.

**Next token.** One random-init ``transformer`` (byte vocabulary, 257) whose ``seq_len`` holds the
prompt and the longest request, so no request reaches the moving window; for each number of new
tokens, ``dew.objectives.decoding.generate`` with ``cached`` True and False, compiled before the
clock starts (a warm-up call each), then timed in interleaved rounds (the order alternating). The
uncached path runs the model over the whole request (prompt + new tokens, padded) for each token,
as sampling did before the cache; the cached one runs the prompt once, then one token per call.
Reported: new tokens per second (all sequences), and the cached/uncached ratio per round and its
median.

**Masked diffusion.** The ``tiny_mdlm`` experiment's model (``simple_dit`` 128 wide, 4 deep, 4
heads, seq_len 64, vocabulary 257 + the mask) samples ``count`` sequences with ``steps`` steps; one
step is one forward pass over all ``count x seq_len`` positions plus a draw, so its cost is stated
as the sampler's time per step against one forward pass timed alone, and as tokens per second
(``count x seq_len`` tokens per ``steps`` forward passes).

    JAX_PLATFORMS=cpu python bench/sampling.py [--lengths 64 256 1024 --rounds 3 --hidden 64 --depth 2]

The last line printed is JSON: {"bench": "sampling", "next_token": [...], "masked_diffusion": {...}}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx

PROMPT = 8


def timed(fn, *args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def per_call(fn, reps: int) -> float:
    """Seconds per call, over ``reps`` calls in a row."""
    return sum(timed(fn) for _ in range(reps)) / reps


def next_token(args: argparse.Namespace) -> list[dict]:
    from dew.models import build
    from dew.objectives.decoding import generate

    fields = dict(
        vocab_size=257,
        seq_len=PROMPT + max(args.lengths),
        hidden_size=args.hidden,
        depth=args.depth,
        num_heads=args.heads,
        dtype="float32",
    )
    graphdef, state = nnx.split(build("transformer", fields, nnx.Rngs(0)))
    prompt = jax.random.randint(jax.random.key(1), (args.count, PROMPT), 0, 256)
    temperature = jnp.float32(1.0)

    def run(new: int, cached: bool):
        return lambda: generate(
            graphdef,
            state,
            prompt,
            jax.random.key(2),
            temperature,
            new=new,
            window=fields["seq_len"],
            top_k=0,
            cached=cached,
        )

    rows = []
    for new in args.lengths:
        sides = {cached: run(new, cached) for cached in (True, False)}
        compile_s = {cached: timed(fn) for cached, fn in sides.items()}  # compiles, then runs once
        # Calls in a row per round: enough for about half a second, so short calls are not one sample.
        reps = {cached: max(1, round(0.5 / timed(fn))) for cached, fn in sides.items()}
        times = {True: [], False: []}
        for r in range(args.rounds):
            for cached in (True, False) if r % 2 == 0 else (False, True):
                times[cached].append(per_call(sides[cached], reps[cached]))
        tokens = args.count * new
        ratios = [u / c for c, u in zip(times[True], times[False])]
        row = {
            "new_tokens": new,
            "count": args.count,
            "cached_tokens_per_sec": round(tokens / statistics.median(times[True]), 1),
            "uncached_tokens_per_sec": round(tokens / statistics.median(times[False]), 1),
            "ratio": round(statistics.median(ratios), 2),
            "ratios": [round(x, 2) for x in ratios],
            "first_call_s": {"cached": round(compile_s[True], 2), "uncached": round(compile_s[False], 2)},
        }
        print(
            f"{new:5d} new tokens x {args.count}: cached {row['cached_tokens_per_sec']:9.1f} tok/s, "
            f"uncached {row['uncached_tokens_per_sec']:9.1f} tok/s, ratio {row['ratio']} "
            f"(rounds {row['ratios']})",
            flush=True,
        )
        rows.append(row)
    return rows


def masked_diffusion(args: argparse.Namespace) -> dict:
    from dew.contract.config import ModelConfig
    from dew.objectives.masked_diffusion import MaskedDiffusionKnobs
    from dew.objectives.mdlm import MaskedDiffusion

    V, L, count = 257, 64, args.mdlm_count
    fields = dict(vocab_size=V + 1, input_size=L, num_classes=0, hidden_size=128, depth=4, num_heads=4)
    o = MaskedDiffusion(ModelConfig("simple_dit", fields, dtype="float32"), MaskedDiffusionKnobs(), V, L)
    graphdef, state = nnx.split(o.build(nnx.Rngs(params=0)))
    z = jnp.full((count, L), o.mask_id, jnp.int32)
    t = jnp.full((count,), 0.5, jnp.float32)
    forward = jax.jit(lambda state, z, t: nnx.merge(graphdef, state)(z, t))
    # The objective's sampler jits its own loop; calling it inside one outer jit compiles it once.
    sample = jax.jit(lambda state, key: o.sample(nnx.merge(graphdef, state), count, key, steps=args.mdlm_steps))
    timed(forward, state, z, t), timed(sample, state, jax.random.key(0))
    forwards, samples = [], []
    for _ in range(args.rounds):
        forwards.append(statistics.median([timed(forward, state, z, t) for _ in range(20)]))
        samples.append(timed(sample, state, jax.random.key(0)))
    forward_ms = 1000 * statistics.median(forwards)
    step_ms = 1000 * statistics.median(samples) / args.mdlm_steps
    row = {
        "count": count,
        "seq_len": L,
        "steps": args.mdlm_steps,
        "forward_ms": round(forward_ms, 2),
        "step_ms": round(step_ms, 2),
        "step_over_forward": round(step_ms / forward_ms, 2),
        "tokens_per_sec": round(count * L / (statistics.median(samples)), 1),
    }
    print(
        f"masked diffusion, {count} x {L} tokens, {args.mdlm_steps} steps: {step_ms:.2f} ms per step, "
        f"one forward {forward_ms:.2f} ms ({row['step_over_forward']}x), {row['tokens_per_sec']} tok/s",
        flush=True,
    )
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024], help="new tokens per request")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--count", type=int, default=1, help="sequences per request (next token)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--mdlm-count", type=int, default=4, help="sequences per masked-diffusion request")
    p.add_argument("--mdlm-steps", type=int, default=64, help="masked-diffusion sampler steps")
    args = p.parse_args()
    result = {
        "bench": "sampling",
        "device": jax.devices()[0].device_kind,
        "model": {
            "hidden": args.hidden,
            "depth": args.depth,
            "heads": args.heads,
            "vocab": 257,
            "prompt": PROMPT,
            "seq_len": PROMPT + max(args.lengths),
        },
        "next_token": next_token(args),
        "masked_diffusion": masked_diffusion(args),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
