"""How long an asynchronous checkpoint blocks the training loop, against the save's whole duration
and against the device-to-host copy it cannot avoid.

The state is a real train state: a ``transformer`` of about 100M parameters (its ``--hidden``,
``--depth`` and vocabulary) with adamw's two moments, built at ``--dtype`` (float32 by default: 12
bytes a parameter). Each save goes through ``dew.training.checkpointing.checkpoints.Checkpoints`` as the trainer
calls it: ``save`` is the time the loop is blocked, ``total`` the time until the step directory is
renamed into place (``wait``), and ``d2h`` the time to copy every leaf to host memory
(``jax.device_get`` plus a NumPy copy, since on a CPU ``device_get`` hands back the device's own
buffer): the part of the blocking no asynchronous save can avoid, as the loop donates its buffers.
Saves are spaced by ``--gap`` seconds of idle loop, as steps would space them; the first save
(orbax's handlers set up) is reported apart.

    JAX_PLATFORMS=cpu python bench/checkpoint.py [--saves 5 --hidden 768 --depth 8 --vocab 32768]

The last line printed is JSON: {"bench": "checkpoint", ...}.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from etils import epath
from flax import nnx


def train_state(hidden: int, depth: int, vocab: int, dtype: str):
    """``{"params", "opt"}`` of a transformer and its adamw state, and its parameter count."""
    from dew.contract.config import OptimConfig
    from dew.contract.models import build
    from dew.training.optim.build import build_optimizer

    model = build(
        "transformer",
        dict(
            vocab_size=vocab, seq_len=1024, hidden_size=hidden, depth=depth, num_heads=hidden // 64, param_dtype=dtype
        ),
        nnx.Rngs(0),
    )
    params = nnx.state(model, nnx.Param)
    opt = build_optimizer(OptimConfig(), params, total_steps=10).tx.init(params)
    count = sum(x.size for x in jax.tree.leaves(params))
    return jax.block_until_ready({"params": params, "opt": opt}), count


def d2h_seconds(state) -> float:
    start = time.perf_counter()
    host = [np.array(x, copy=True) for x in jax.device_get(jax.tree.leaves(state))]
    del host
    return time.perf_counter() - start


def measure(state, directory: Path, saves: int, gap: float) -> list[dict[str, float]]:
    from dew.training.checkpointing.checkpoints import Checkpoints

    ckpts = Checkpoints(epath.Path(directory), keep=2)
    rows = []
    for i in range(saves + 1):
        d2h = d2h_seconds(state)
        start = time.perf_counter()
        ckpts.save(i + 1, state, {"step": i + 1}, metrics=None)
        blocking = time.perf_counter() - start
        ckpts.wait()
        rows.append({"blocking_s": blocking, "total_s": time.perf_counter() - start, "d2h_s": d2h})
        time.sleep(gap)
    ckpts.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--saves", type=int, default=5, help="timed saves, after one untimed")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--dtype", default="float32", help="parameter (and moment) storage dtype")
    parser.add_argument("--gap", type=float, default=0.5, help="seconds between saves")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    logging.getLogger("absl").setLevel(logging.ERROR)

    state, count = train_state(args.hidden, args.depth, args.vocab, args.dtype)
    size = sum(x.nbytes for x in jax.tree.leaves(state))
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = measure(state, Path(tmp) / "ckpt", args.saves, args.gap)
    first, timed = rows[0], rows[1:]
    med = {k: statistics.median(r[k] for r in timed) for k in timed[0]}
    share = [r["blocking_s"] / r["total_s"] for r in timed]
    over_d2h = [r["blocking_s"] / r["d2h_s"] for r in timed]
    print(
        f"{count / 1e6:.1f}M parameters, state {size / 2**20:.0f} MiB in {len(jax.tree.leaves(state))} "
        f"arrays: save blocks {1000 * med['blocking_s']:.0f} ms of {1000 * med['total_s']:.0f} ms "
        f"({100 * statistics.median(share):.1f}%, range {100 * min(share):.1f}-{100 * max(share):.1f}%); "
        f"the D2H copy alone {1000 * med['d2h_s']:.0f} ms; first save blocks {1000 * first['blocking_s']:.0f} ms"
    )
    print(
        json.dumps(
            {
                "bench": "checkpoint",
                "parameters": count,
                "state_mib": round(size / 2**20, 1),
                "arrays": len(jax.tree.leaves(state)),
                "saves": args.saves,
                "device": jax.devices()[0].device_kind,
                "blocking_ms": round(1000 * med["blocking_s"], 1),
                "total_ms": round(1000 * med["total_s"], 1),
                "d2h_ms": round(1000 * med["d2h_s"], 1),
                "first_blocking_ms": round(1000 * first["blocking_s"], 1),
                "blocking_share": round(statistics.median(share), 4),
                "blocking_share_range": [round(min(share), 4), round(max(share), 4)],
                "blocking_over_d2h": round(statistics.median(over_d2h), 3),
                "blocking_over_d2h_range": [round(min(over_d2h), 3), round(max(over_d2h), 3)],
            }
        )
    )


if __name__ == "__main__":
    main()
