"""Reading a sharded bfloat16 Hugging Face Llama directory (``trainer.init_from=DIR``) against reading
the same files with safetensors alone, in time and in host memory.

The directory is a ``transformer`` of about 100M parameters (``--hidden``, ``--depth``, ``--mlp``,
``--vocab``; untied) written by dew's exporter in bfloat16, sharded at ``--max-shard-size`` behind
``model.safetensors.index.json``, as the hub holds Llama checkpoints. Each reading runs in its own
fresh process, so that its peak resident memory (``ru_maxrss``) is its own:

- ``dew``: ``dew.training.checkpointing.hf_weights.read`` into float32 parameters on the CPU device,
  what a warm start does (the config checked, every shard read, cast, laid out and placed);
- ``dew_untiled``: the same, each transposed write in one pass instead of tiles (``hf_weights.place``):
  what the tiling gains;
- ``safetensors``: ``safetensors.numpy.load_file`` of every shard, kept: the bytes read and nothing
  else done;
- ``flax``: ``safetensors.flax.load_file`` of every shard: the same bytes as JAX arrays (bf16, in
  Llama's layout);
- ``cast``: the ``safetensors`` reading, each tensor then cast to float32 by NumPy (and only that kept): the least any
  reader that hands over float32 parameters does, without dew's layouts or JAX.

Each process reports its wall time and its peak resident memory (``VmHWM``) above what it held just before
reading (the interpreter, JAX and the abstract model); rounds alternate the two, after one unmeasured
round that warms the page cache. ``time_ratio`` is dew's median time over safetensors',
``time_over_flax`` and ``time_over_cast`` over the others'; ``peak_over_f32``
is dew's largest peak increase over the model's float32 size (what it must hold at the end).

    JAX_PLATFORMS=cpu python bench/hf_read.py [--rounds 3 --hidden 768 --depth 10 --vocab 16384]

The last line printed is JSON: {"bench": "hf_read", ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MODES = ("dew", "dew_untiled", "safetensors", "flax", "cast")
"""The readings compared (the module's docstring)."""


def fields(args: argparse.Namespace) -> dict:
    return dict(
        vocab_size=args.vocab,
        seq_len=1024,
        hidden_size=args.hidden,
        depth=args.depth,
        num_heads=args.hidden // 64,
        mlp_hidden=args.mlp,
        norm_eps=1e-5,
        dtype="float32",
        param_dtype="float32",
    )


def write(args: argparse.Namespace, out: str) -> int:
    """Write the directory; returns the parameter count."""
    from flax import nnx

    from dew.contract.models import of
    from dew.training.checkpointing import hf_weights

    arch = of("transformer", fields(args))
    abstract = nnx.eval_shape(lambda: arch.build(nnx.Rngs(params=0)))
    rng = np.random.default_rng(0)
    params = {
        "/".join(map(str, p)): rng.standard_normal(v.shape, np.float32) * np.float32(0.02)
        for p, v in nnx.to_flat_state(nnx.state(abstract, nnx.Param))
    }
    count = sum(v.size for v in params.values())
    hf_weights.write_directory(
        arch.fields, params, out, dtype="bfloat16", max_bytes=hf_weights.parse_size(args.max_shard_size)
    )
    return count


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def high_water_bytes() -> int:
    """This process's peak resident memory, ``VmHWM``: not ``ru_maxrss``, which a process started by
    fork and exec inherits from its parent's size at the fork."""
    with open("/proc/self/status") as fh:
        line = next(line for line in fh if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def child(args: argparse.Namespace) -> None:
    """One reading in this process: prints ``{"seconds", "peak_increase", "before"}``."""
    directory = args.child_dir
    if args.child == "flax":
        import jax
        from safetensors.flax import load_file as load_jax

        files = sorted(str(p) for p in Path(directory).glob("model-*.safetensors"))
        jax.block_until_ready(jax.device_put(np.zeros(4)))  # the backend up before the baseline
        before = rss_bytes()
        start = time.perf_counter()
        held = jax.block_until_ready([load_jax(f) for f in files])
        seconds = time.perf_counter() - start
    elif args.child in ("safetensors", "cast"):
        import ml_dtypes  # noqa: F401 - registers bfloat16 with NumPy, which safetensors reads into
        from safetensors.numpy import load_file

        files = sorted(str(p) for p in Path(directory).glob("model-*.safetensors"))
        before = rss_bytes()
        start = time.perf_counter()
        if args.child == "safetensors":
            held = [load_file(f) for f in files]
        else:
            held = [{k: v.astype(np.float32) for k, v in load_file(f).items()} for f in files]
        seconds = time.perf_counter() - start
    else:
        import jax
        from flax import nnx

        from dew.contract.models import of
        from dew.training.checkpointing import hf_weights

        if args.child == "dew_untiled":
            hf_weights.TILE = 1 << 20  # every matrix at most one tile: one pass
        arch = of("transformer", fields(args))
        abstract = nnx.eval_shape(lambda: arch.build(nnx.Rngs(params=0)))
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = {
            p: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=device)
            for p, v in nnx.to_flat_state(nnx.state(abstract, nnx.Param))
        }
        jax.block_until_ready(jax.device_put(np.zeros(4)))  # the backend up before the baseline
        before = rss_bytes()
        start = time.perf_counter()
        hf_weights.dew_shapes(arch.fields, directory)
        held = jax.block_until_ready(hf_weights.read(arch.fields, directory, target))
        seconds = time.perf_counter() - start
    peak = high_water_bytes()
    print(json.dumps({"seconds": seconds, "peak_increase": peak - before, "before": before, "held": len(held)}))


def run_child(args: argparse.Namespace, mode: str, directory: str) -> dict:
    argv = [sys.executable, __file__, "--child", mode, "--child-dir", directory]
    argv += [
        "--hidden",
        str(args.hidden),
        "--depth",
        str(args.depth),
        "--mlp",
        str(args.mlp),
        "--vocab",
        str(args.vocab),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    if done.returncode:
        sys.exit(f"bench/hf_read.py --child {mode} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--depth", type=int, default=10)
    p.add_argument("--mlp", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--max-shard-size", default="50MB")
    p.add_argument("--child", choices=tuple(MODES), help=argparse.SUPPRESS)
    p.add_argument("--child-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        count = write(args, tmp)
        shards = len(list(Path(tmp).glob("model-*.safetensors")))
        runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for r in range(args.rounds + 1):
            for mode in MODES if r % 2 else MODES[::-1]:
                record = run_child(args, mode, tmp)
                if r:  # round 0 warms the page cache
                    runs[mode].append(record)
    f32 = 4 * count
    seconds = {m: [r["seconds"] for r in v] for m, v in runs.items()}
    peaks = {m: [r["peak_increase"] for r in v] for m, v in runs.items()}
    ratios = [d / s for d, s in zip(seconds["dew"], seconds["safetensors"], strict=True)]
    record = {
        "bench": "hf_read",
        "params": count,
        "shards": shards,
        "f32_mb": f32 / 1e6,
        "bf16_files_mb": 2 * count / 1e6,
        "dew_s": seconds["dew"],
        "safetensors_s": seconds["safetensors"],
        "time_ratio": statistics.median(seconds["dew"]) / statistics.median(seconds["safetensors"]),
        "time_ratios": ratios,
        "dew_untiled_s": seconds["dew_untiled"],
        "untiled_over_tiled": statistics.median(seconds["dew_untiled"]) / statistics.median(seconds["dew"]),
        "flax_s": seconds["flax"],
        "time_over_flax": statistics.median(seconds["dew"]) / statistics.median(seconds["flax"]),
        "cast_s": seconds["cast"],
        "time_over_cast": statistics.median(seconds["dew"]) / statistics.median(seconds["cast"]),
        "dew_peak_mb": [x / 1e6 for x in peaks["dew"]],
        "safetensors_peak_mb": [x / 1e6 for x in peaks["safetensors"]],
        "cast_peak_mb": [x / 1e6 for x in peaks["cast"]],
        "flax_peak_mb": [x / 1e6 for x in peaks["flax"]],
        "peak_over_f32": max(peaks["dew"]) / f32,
        "peak_over_f32s": [x / f32 for x in peaks["dew"]],
    }
    print(
        f"{count / 1e6:.0f}M parameters in {shards} bf16 shards: dew {statistics.median(seconds['dew']):.2f} s, "
        f"(untiled writes {statistics.median(seconds['dew_untiled']):.2f} s), "
        f"safetensors {statistics.median(seconds['safetensors']):.2f} s (x{record['time_ratio']:.2f}), "
        f"safetensors into JAX {statistics.median(seconds['flax']):.2f} s (x{record['time_over_flax']:.2f}), "
        f"safetensors and a cast to float32 {statistics.median(seconds['cast']):.2f} s "
        f"(x{record['time_over_cast']:.2f}); "
        f"dew's peak {max(peaks['dew']) / 1e6:.0f} MB above its start = {record['peak_over_f32']:.2f}x the "
        f"float32 model ({f32 / 1e6:.0f} MB)"
    )
    print(json.dumps(record))


if __name__ == "__main__":
    main()
