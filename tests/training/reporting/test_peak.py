"""The CPU's matmul ceiling (dew.training.reporting.peak): measured once, cached, and what CPU runs' MFU is against."""

import json

import jax

from dew.training.reporting import peak
from dew.training.reporting.tracker import peak_flops


def test_the_ceiling_is_measured_once_and_read_back(tmp_path, monkeypatch):
    calls = []
    real = peak.matmul_flops_per_sec
    monkeypatch.setattr(peak, "matmul_flops_per_sec", lambda dtype: calls.append(dtype) or real(dtype, side=128))
    path = tmp_path / "peak.json"
    first = peak.measured_peak_flops("float32", path)
    again = peak.measured_peak_flops("float32", path)
    assert calls == ["float32"] and again == first > 1e8  # any CPU does more than 0.1 GFLOP/s
    ((key, value),) = json.loads(path.read_text()).items()
    assert value == first and key.endswith("|cpu|1|float32")


def test_a_cpu_run_has_a_peak_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(peak, "matmul_flops_per_sec", lambda dtype, side=peak.SIDE: 5e10)
    assert peak_flops(jax.devices()[0].device_kind, "float32", jax.device_count()) == 5e10
    assert (tmp_path / "dew" / "peak_flops.json").exists()
    assert peak_flops("NVIDIA H100 80GB HBM3", "bfloat16", 8) == 8 * 989e12
    assert peak_flops("some other accelerator", "float32", 1) is None
