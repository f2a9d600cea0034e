"""Token-window pipeline against raw NumPy fancy indexing on the same memory-mapped file.

Both sides read the same random windows of seq_len + 1 tokens from one uint16 file: the raw side
is ``tokens[idx[:, None] * L + arange(L + 1)]`` on a precomputed permutation, the pipeline side is
``token_windows``' iterator (shuffle, shard, one gather, int32 cast). They run interleaved, round
by round in the same process, so both see the same page cache and machine load; the figure is the
median over rounds of pipeline throughput / raw throughput.

    JAX_PLATFORMS=cpu python bench/data_pipeline.py [--tokens 50000000 --seq-len 1024 --batch 64]

Then ``image_folder``'s decoding (bench/_image_decode.py): images per second on this machine's cores
(threads, one thread, a pool of processes), the load-time check, and one batch's decode as a share of a
step of the digits experiment's DiT; the record's ``image_folder`` field.

    JAX_PLATFORMS=cpu python bench/data_pipeline.py [--images 1024 --image-source 64 --image-size 8 --channels 1]

The last line printed is JSON: {"bench": "data_pipeline", "ratio": ..., "image_folder": {...}, ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np

from dew.data.specs import TokenWindows

if __package__:  # imported as bench.data_pipeline
    from bench._image_decode import image_decode
else:  # run as a script: bench/ is first on sys.path
    from _image_decode import image_decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=50_000_000, help="tokens in the file")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64, help="global batch, windows")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batches", type=int, default=20, help="batches per side per round")
    parser.add_argument("--images", type=int, default=1024, help="image_folder: generated images")
    parser.add_argument("--image-source", type=int, default=64, help="image_folder: their side, pixels")
    parser.add_argument("--image-size", type=int, default=8, help="image_folder: data.image_size (digits: 8)")
    parser.add_argument("--channels", type=int, default=1, help="image_folder: data.channels (digits: 1)")
    parser.add_argument("--image-batch", type=int, default=128, help="image_folder: batch (the digits experiment's)")
    args = parser.parse_args()
    L, B = args.seq_len, args.batch

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tokens.bin")
        rng = np.random.default_rng(0)
        mm = np.memmap(path, np.uint16, "w+", shape=(args.tokens,))
        for start in range(0, args.tokens, 1 << 24):
            stop = min(args.tokens, start + (1 << 24))
            mm[start:stop] = rng.integers(0, 50_257, stop - start, dtype=np.uint16)
        mm.flush()
        del mm
        tokens = np.memmap(path, np.uint16, "r")
        offsets = np.arange(L + 1)
        windows = (len(tokens) - 1) // L
        perm = np.random.default_rng(1).permutation(windows)
        ds = TokenWindows(path=path, seq_len=L, vocab_size=50_257).load(batch_size=B, seed=0)
        it = ds.iterator()

        def raw(r: int) -> None:
            for b in range(args.batches):
                s = ((r * args.batches + b) * B) % (windows - B)
                idx = perm[s : s + B]
                np.asarray(tokens[idx[:, None] * L + offsets], np.int32)

        def pipeline(r: int) -> None:
            for _ in range(args.batches):
                it.next()

        raw(0), pipeline(0)  # warm the page cache and the epoch order
        ratios, rates = [], {"raw": [], "pipeline": []}
        for r in range(1, args.rounds + 1):
            times = {}
            for name, fn in (("raw", raw), ("pipeline", pipeline)) if r % 2 else (("pipeline", pipeline), ("raw", raw)):
                t = time.perf_counter()
                fn(r)
                times[name] = time.perf_counter() - t
            for name, seconds in times.items():
                rates[name].append(args.batches * B * L / seconds)
            ratios.append(times["raw"] / times["pipeline"])
        result = {
            "bench": "data_pipeline",
            "ratio": round(statistics.median(ratios), 3),
            "ratios": [round(x, 3) for x in ratios],
            "pipeline_tokens_per_s": round(statistics.median(rates["pipeline"])),
            "raw_tokens_per_s": round(statistics.median(rates["raw"])),
            "seq_len": L,
            "batch": B,
            "file_tokens": args.tokens,
            "rounds": args.rounds,
        }
    result["image_folder"] = image_decode(
        args.images, args.image_source, args.image_batch, args.image_size, args.channels, rounds=7
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
