"""Token-window pipelines against raw NumPy fancy indexing on the same memory-mapped file.

Two pairs, each read side by side:

- ``token_windows``: random windows of seq_len + 1 tokens from one uint16 file. The raw side is
  ``tokens[idx[:, None] * L + arange(L + 1)]`` on a precomputed permutation, the pipeline side is
  ``token_windows``' iterator (shuffle, shard, one gather, int32 cast): ``ratio``.
- ``hf_text`` in its cache mode: a ``save_to_disk`` dataset of generated text (``--hf-tokens``
  bytes, documents of about 2,000) is tokenized once into its cache (timed: ``hf_cache_build_s``),
  then its iterator is read against the same raw indexing of the cache's own token file:
  ``hf_text_ratio``.

Each ratio is given in wall time and in CPU time (``cpu_ratio``, ``hf_text_cpu_ratio``: the
process's own CPU seconds, which a busy shared machine disturbs much less).

The sides run interleaved, round by round in the same process, so each pair sees the same page
cache and machine load; each figure is the median over rounds of pipeline throughput / raw throughput.

    JAX_PLATFORMS=cpu python bench/data_pipeline.py [--tokens 50000000 --seq-len 1024 --batch 64]

Then ``image_folder``'s decoding (bench/_image_decode.py): images per second on this machine's cores
(threads, one thread, a pool of processes), the load-time check, and one batch's decode as a share of a
step of the digits experiment's DiT; the record's ``image_folder`` field.

    JAX_PLATFORMS=cpu python bench/data_pipeline.py [--images 1024 --image-source 64 --image-size 8 --channels 1]

The last line printed is JSON: {"bench": "data_pipeline", "ratio": ..., "hf_text_ratio": ...,
"image_folder": {...}, ...}.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import tempfile
import time

import numpy as np

from dew.data.specs import HFText, TokenWindows
from dew.data.token_files import open_tokens


def hf_text_source(directory: str, tokens: int) -> str:
    """A save_to_disk dataset of ``tokens`` bytes of generated text, documents of about 2,000 bytes."""
    import datasets  # heavy: only this benchmark's hf_text side needs it

    rng = np.random.default_rng(2)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", np.uint8)
    docs = max(1, tokens // 2_000)
    text = letters[rng.integers(0, len(letters), docs * 2_000)].tobytes().decode()
    path = os.path.join(directory, "hf_source")
    datasets.Dataset.from_dict({"text": [text[i * 2_000 : (i + 1) * 2_000] for i in range(docs)]}).save_to_disk(path)
    return path


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
    parser.add_argument("--hf-tokens", type=int, default=20_000_000, help="bytes of text in the hf_text source")
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

        hf_spec = HFText(path=hf_text_source(tmp, args.hf_tokens), seq_len=L, cache_dir=os.path.join(tmp, "cache"))
        t = time.perf_counter()
        hf = hf_spec.load(batch_size=B, seed=0)
        hf_build_s = time.perf_counter() - t
        assert hf.num_records is not None
        hf_it = hf.iterator()
        (cache_file,) = glob.glob(os.path.join(tmp, "cache", "hf_text", "*", "train.bin"))
        hf_tokens = open_tokens(cache_file, "llmc")
        hf_perm = np.random.default_rng(1).permutation(hf.num_records)

        def raw(r: int) -> None:
            for b in range(args.batches):
                s = ((r * args.batches + b) * B) % (windows - B)
                idx = perm[s : s + B]
                np.asarray(tokens[idx[:, None] * L + offsets], np.int32)

        def pipeline(r: int) -> None:
            for _ in range(args.batches):
                it.next()

        def hf_raw(r: int) -> None:
            for b in range(args.batches):
                s = ((r * args.batches + b) * B) % (len(hf_perm) - B)
                idx = hf_perm[s : s + B]
                np.asarray(hf_tokens[idx[:, None] * L + offsets], np.int32)

        def hf_pipeline(r: int) -> None:
            for _ in range(args.batches):
                hf_it.next()

        pairs = {"": (raw, pipeline), "hf_": (hf_raw, hf_pipeline)}
        for raw_side, pipeline_side in pairs.values():  # warm the page cache and the epoch order
            raw_side(0), pipeline_side(0)
        ratios: dict[str, list[float]] = {k: [] for k in pairs}
        cpu_ratios: dict[str, list[float]] = {k: [] for k in pairs}
        rates: dict[str, list[float]] = {f"{k}{side}": [] for k in pairs for side in ("raw", "pipeline")}
        for r in range(1, args.rounds + 1):
            for prefix, (raw_side, pipeline_side) in pairs.items():
                times, cpu = {}, {}
                sides = (("raw", raw_side), ("pipeline", pipeline_side))
                for name, fn in sides if r % 2 else sides[::-1]:
                    t, c = time.perf_counter(), time.process_time()
                    fn(r)
                    times[name], cpu[name] = time.perf_counter() - t, time.process_time() - c
                for name, seconds in times.items():
                    rates[prefix + name].append(args.batches * B * L / seconds)
                ratios[prefix].append(times["raw"] / times["pipeline"])
                cpu_ratios[prefix].append(cpu["raw"] / max(cpu["pipeline"], 1e-9))
        result = {
            "bench": "data_pipeline",
            "ratio": round(statistics.median(ratios[""]), 3),
            "ratios": [round(x, 3) for x in ratios[""]],
            "pipeline_tokens_per_s": round(statistics.median(rates["pipeline"])),
            "raw_tokens_per_s": round(statistics.median(rates["raw"])),
            "cpu_ratio": round(statistics.median(cpu_ratios[""]), 3),
            "hf_text_ratio": round(statistics.median(ratios["hf_"]), 3),
            "hf_text_ratios": [round(x, 3) for x in ratios["hf_"]],
            "hf_text_cpu_ratio": round(statistics.median(cpu_ratios["hf_"]), 3),
            "hf_text_cpu_ratios": [round(x, 3) for x in cpu_ratios["hf_"]],
            "hf_text_tokens_per_s": round(statistics.median(rates["hf_pipeline"])),
            "hf_raw_tokens_per_s": round(statistics.median(rates["hf_raw"])),
            "hf_cache_build_s": round(hf_build_s, 2),
            "hf_tokens": len(hf_tokens),
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
