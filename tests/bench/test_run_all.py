"""``python -m bench`` finds the benchmarks by listing bench/ and tables their ratios with spread."""

import importlib

suite = importlib.import_module("bench.__main__")


def test_the_suite_lists_every_cpu_benchmark_and_leaves_the_gpu_check_out():
    names = suite.discover()
    assert {"data_pipeline", "trainer_overhead", "remat", "checkpoint"} <= set(names)
    assert "gpu" not in names and "__main__" not in names


def test_ratios_come_with_their_spread_nested_records_included():
    record = {
        "ratio": 1.02,
        "ratios": [0.9, 1.02, 1.1, 1.0],
        "step_ms": 3.0,
        "cpu_ratio": 0.99,
        "cpu_ratios": [0.98, 0.99, 1.0],
        "models": {"transformer": {"full": {"cpu_vs_none": 0.8, "cpu_vs_none_range": [0.7, 0.9]}}},
        "blocking_share": 0.02,
    }
    assert suite.ratios(record) == [
        ("ratio", 1.02, [0.9, 1.1]),
        ("cpu_ratio", 0.99, [0.98, 1.0]),
        ("models.transformer.full.cpu_vs_none", 0.8, [0.7, 0.9]),
        ("blocking_share", 0.02, None),
    ]
