"""A device's matmul ceiling, measured once per machine, for the MFU of devices no data sheet covers.

``dew.training.reporting.tracker.PEAK_FLOPS`` holds the vendors' figures for the accelerators it names; a CPU
has no such figure (it depends on the cores, their vector units and the BLAS XLA calls), so without
this a CPU run logged no ``perf/mfu``. The ceiling here is what a jitted square matmul reaches on
this machine: the best of a few timed repetitions, taken once and kept in a small JSON file in the
user's cache directory (``$XDG_CACHE_HOME/dew/peak_flops.json``), keyed by host, device kind, device
count and dtype, so later runs read it instead of measuring again. MFU against it says how close a
step comes to what this machine's matmuls can do, not to a vendor's number.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import time
from pathlib import Path

log = logging.getLogger("dew")

SIDE = 1024
"""Side of the square matmul timed: 2.1 GFLOP, tens of milliseconds on a CPU core."""
MIN_SECONDS = 0.3
"""The repetitions run at least this long (and at least ``MIN_REPEATS`` times)."""
MIN_REPEATS = 3


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dew" / "peak_flops.json"


def matmul_flops_per_sec(dtype: str, side: int = SIDE) -> float:
    """The best FLOP/s of a jitted ``side`` x ``side`` matmul in ``dtype`` on the default device."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (side, side), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (side, side), jnp.float32).astype(dtype)
    matmul = jax.jit(lambda a, b: a @ b)
    matmul(a, b).block_until_ready()  # compile
    best, start, repeats = float("inf"), time.perf_counter(), 0
    while repeats < MIN_REPEATS or time.perf_counter() - start < MIN_SECONDS:
        t0 = time.perf_counter()
        matmul(a, b).block_until_ready()
        best, repeats = min(best, time.perf_counter() - t0), repeats + 1
    return 2 * side**3 / best


def measured_peak_flops(dtype: str, path: Path | None = None) -> float:
    """FLOP/s of one local device in ``dtype`` from the cache, measuring and storing it when absent.

    A cache that cannot be read or written is measured around and logged, never fatal.
    """
    import jax

    path = path or cache_path()
    device = jax.devices()[0]
    key = f"{socket.gethostname()}|{device.platform}|{device.device_kind}|{jax.local_device_count()}|{dtype}"
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    if isinstance(table.get(key), (int, float)):
        return float(table[key])
    peak = matmul_flops_per_sec(dtype)
    log.info(
        "measured the %s matmul ceiling of this %s: %.3g FLOP/s (cached in %s)", dtype, device.device_kind, peak, path
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump({**table, key: peak}, f, indent=1, sort_keys=True)
        os.replace(f.name, path)  # a reader sees the old table or the new one, never half of one
    except OSError as err:
        log.info("could not cache the matmul ceiling in %s: %s", path, err)
    return peak
