"""bench/gpu.py at toy shapes on the CPU, so the GPU check cannot rot before a GPU runs it."""

import importlib
import json

import pytest

gpu = importlib.import_module("bench.gpu")


@pytest.mark.slow
def test_every_measurement_is_recorded_and_cudnn_is_skipped_with_its_reason(tmp_path, monkeypatch):

    monkeypatch.setenv("DEW_TRACKING_DIR", str(tmp_path / "tracking"))
    out = tmp_path / "gpu.jsonl"
    assert gpu.main(["--smoke", "--out", str(out), "--cases", "lm_124m,dit_b2", "--remat", "none"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    ceiling, *steps, checkpoint = records
    assert ceiling["measure"] == "matmul_ceiling" and ceiling["tflops"] > 0
    assert ceiling["datasheet_tflops"] is None  # a CPU has no data sheet entry
    ran = {(r["model"], r["side"]): r for r in steps if "side" in r}
    for model in ("lm_124m", "dit_b2"):
        for side in ("bare", "dew"):
            r = ran[(model, side)]
            assert r["attention_impl"] == "xla" and r["step_ms"] > 0 and r["examples_per_sec"] > 0
            assert r["remat"] == "none"  # both sides built with --remat
            assert r["mfu_vs_ceiling"] > 0 and r["mfu_vs_datasheet"] is None
    skipped = [r for r in steps if "skipped" in r]
    assert {r["model"] for r in skipped} == {"lm_124m", "dit_b2"}
    assert all(r["attention_impl"] == "cudnn" and "not a CUDA GPU" in r["skipped"] for r in skipped)
    assert checkpoint["measure"] == "checkpoint" and 0 < checkpoint["blocking_ms"] <= checkpoint["total_ms"]
