"""How full ``data.documents=true`` fills its windows on short documents, and what packing costs.

Draws document lengths from a log-normal (the median and spread given), writes them as one token
file framed as dew-prepare frames them (the ids, then the end-of-text id), packs them with
``dew.data.packing.PackedTable`` at each ``--seq-len`` and reports the share of real (not padding)
tokens, the time to pack and the time to gather a batch. The last line is the JSON record.

    JAX_PLATFORMS=cpu python bench/packing.py                       # 300,000 documents, median 33 tokens
    JAX_PLATFORMS=cpu python bench/packing.py --documents 3000      # a quick look
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from dew.data.packing import Framing, PackedTable

EOS = 256


def measure(lengths: np.ndarray, seq_len: int, batch: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, EOS, int(lengths.sum())).astype(np.uint16)
    tokens[np.cumsum(lengths) - 1] = EOS  # each document ends with the end-of-text id
    start = time.perf_counter()
    table = PackedTable([tokens], seq_len, Framing(EOS, has_bos=False))
    pack_s = time.perf_counter() - start
    windows = [rng.integers(0, table.num_windows, batch) for _ in range(20)]
    start = time.perf_counter()
    for w in windows:
        table.gather(w)
    return {
        "seq_len": seq_len,
        "windows": table.num_windows,
        "real_fraction": round(table.real_fraction(), 4),
        "pack_s": round(pack_s, 3),
        "gather_batch_ms": round((time.perf_counter() - start) / len(windows) * 1e3, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=300_000)
    parser.add_argument("--median", type=float, default=33.0, help="median document length, tokens")
    parser.add_argument("--sigma", type=float, default=0.8, help="log-normal spread of the lengths")
    parser.add_argument("--seq-len", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    lengths = np.maximum(1, rng.lognormal(np.log(args.median), args.sigma, args.documents).astype(np.int64)) + 1
    rows = [measure(lengths, L, args.batch, args.seed) for L in args.seq_len]
    for row in rows:
        print(
            f"seq_len {row['seq_len']}: {row['real_fraction']:.1%} real tokens in {row['windows']} windows, "
            f"packed in {row['pack_s']} s, a batch of {args.batch} gathered in {row['gather_batch_ms']} ms"
        )
    record = {
        "bench": "packing",
        "documents": args.documents,
        "mean_length": round(float(lengths.mean()), 2),
        "rows": rows,
    }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
