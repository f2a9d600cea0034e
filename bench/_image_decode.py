"""``image_folder``'s decoding, measured for bench/data_pipeline.py: images per second in one
thread, in the dataset's thread pool and in a pool of processes, the load-time check, and the time
to decode one batch as a share of a step of the digits experiment's DiT at the same batch.

A folder of ``count`` generated images (``source`` pixels square, smooth colour fields with noise,
half PNG and half JPEG, in 4 class folders) is read through ``ImageFolder(...).load`` and decoded
``batch`` random records at a time (``ImageRecords.pixels``: fetch, decode, centre crop, resize),
``rounds`` rounds with the three ways interleaved, so all see the same page cache and machine load.
The process pool (``spawn``: a fork of a process holding JAX's threads is unsafe) maps the same
decode function over the same paths. The step is ``bench._loops.bare_loop`` on the digits DiT
(``conf/experiment/digits.yaml``) with one synthetic batch of the decoded images' shape.
The underscore keeps ``python -m bench`` from taking this module for a benchmark.
"""

from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing
import os
import statistics
import time
from pathlib import Path

import numpy as np
from PIL import Image

from dew.data.images import DecodePool, ImageRecords, check_sources, to_pixels
from dew.data.specs import ImageFolder


def write_images(root: Path, count: int, source: int) -> None:
    """``count`` images of ``source`` x ``source`` pixels in 4 class folders, PNG and JPEG alternately."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[:source, :source] / source
    for i in range(count):
        folder = root / f"class{i % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        a, b, c = rng.uniform(0, 255, 3)
        field = np.stack([a * x + 40 * y, b * y, c * (1 - x) * y], -1) + rng.normal(0, 12, (source, source, 3))
        Image.fromarray(np.clip(field, 0, 255).astype(np.uint8)).save(folder / f"{i}.{'png' if i % 2 else 'jpg'}")


def digits_step_seconds(batch: int, image_size: int, channels: int, steps: int = 30) -> float:
    """Seconds of one step of the digits experiment's DiT on a batch of ``batch`` images of this shape."""
    import jax

    from dew.build import build_objective, resolve

    if __package__:  # imported as bench._image_decode
        from bench._loops import Synthetic, bare_loop
        from bench.trainer_overhead import compose
    else:  # from a script: bench/ is first on sys.path
        from _loops import Synthetic, bare_loop
        from trainer_overhead import compose

    run = compose("experiment=digits", f"trainer.batch_size={batch}", "optim.schedule.warmup_steps=1")
    data = Synthetic("simple_dit", {"input_size": image_size, "in_channels": channels, "num_classes": 4}, batch)
    run = resolve(run, data)
    wall, _ = bare_loop(build_objective(run, data), run.optim, data, steps=steps, warmup=3)
    jax.clear_caches()
    return wall / steps


def measure(root: Path, *, batch: int, image_size: int, channels: int, rounds: int, threads: int) -> dict:
    """Images per second of each way of decoding, interleaved round by round."""
    ds = ImageFolder(root=str(root), image_size=image_size, channels=channels, decode_threads=threads).load(batch, 0)
    records = ds.train
    assert isinstance(records, ImageRecords)
    serial = ImageRecords(records.fetch, records.name, records.labels, image_size, channels, DecodePool(1))
    decode = functools.partial(to_pixels, image_size=image_size, channels=channels)
    processes = concurrent.futures.ProcessPoolExecutor(threads, mp_context=multiprocessing.get_context("spawn"))
    list(processes.map(decode, records.fetch(np.arange(threads * 4))))  # the workers started and warm

    def in_processes(indices: np.ndarray) -> np.ndarray:
        return np.stack(list(processes.map(decode, records.fetch(indices), chunksize=max(1, batch // (4 * threads)))))

    ways = {"serial": serial.pixels, "threads": records.pixels, "processes": in_processes}
    rng = np.random.default_rng(1)
    rates: dict[str, list[float]] = {name: [] for name in ways}
    per_round = max(1, records.num_records // batch)
    for r in range(rounds):
        order = list(ways) if r % 2 else list(reversed(ways))
        for name in order:
            batches = [rng.choice(records.num_records, batch, replace=False) for _ in range(per_round)]
            start = time.perf_counter()
            for indices in batches:
                ways[name](indices)
            rates[name].append(per_round * batch / (time.perf_counter() - start))
    processes.shutdown()
    start = time.perf_counter()
    check_sources(records)
    check_rate = records.num_records / (time.perf_counter() - start)
    return {name: statistics.median(v) for name, v in rates.items()} | {"check": check_rate}


def image_decode(count: int, source: int, batch: int, image_size: int, channels: int, rounds: int) -> dict:
    """The record data_pipeline.py prints under ``image_folder``."""
    import tempfile

    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        write_images(Path(tmp), count, source)
        rates = measure(
            Path(tmp), batch=batch, image_size=image_size, channels=channels, rounds=rounds, threads=threads
        )
    step = digits_step_seconds(batch, image_size, channels)
    batch_seconds = batch / rates["threads"]
    return {
        "images_per_s": round(rates["threads"]),
        "serial_images_per_s": round(rates["serial"]),
        "processes_images_per_s": round(rates["processes"]),
        "check_images_per_s": round(rates["check"]),
        "threads_vs_serial": round(rates["threads"] / rates["serial"], 3),
        "threads_vs_processes": round(rates["threads"] / rates["processes"], 3),
        "batch_decode_ms": round(1000 * batch_seconds, 2),
        "digits_step_ms": round(1000 * step, 2),
        "step_share": round(batch_seconds / step, 3),
        "threads": threads,
        "images": count,
        "source_pixels": source,
        "image_size": image_size,
        "channels": channels,
        "batch": batch,
    }
