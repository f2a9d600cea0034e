"""bench/mup_transfer.py at a tiny size, so the command docs/mup.md quotes cannot rot: it sweeps,
summarises and draws, and at its base width muP is the standard model exactly."""

import importlib

import pytest

bench = importlib.import_module("bench.mup_transfer")


@pytest.mark.slow
def test_the_sweep_runs_and_mup_at_its_base_width_is_the_standard_model(tmp_path):
    figure = tmp_path / "mup_transfer.png"
    record = bench.main(
        [
            "--widths",
            "16,32",
            "--base-width",
            "16",
            "--rates=-6,-4",
            "--steps",
            "8",
            "--batch",
            "2",
            "--seq-len",
            "8",
            "--eval-batches",
            "1",
            "--heads",
            "2",
            # One block, not the script's two: each block's muP is the same (the hidden matrices'
            # groups and multipliers, the attention's scale), and the blocks are one scanned stack;
            # the eager build, the optimizer's initialisation and the steps of the four models are
            # what a second block added (the test: 19.3 -> 14.8 CPU-s standalone, a loaded machine).
            "--depth",
            "1",
            "--figure",
            str(figure),
        ]
    )
    assert record["bench"] == "mup_transfer" and record["rates"] == [2.0**-6, 2.0**-4]
    sp, mup = record["sp"], record["mup"]
    # at the base width every muP multiplier and group is the standard one: the same losses (with
    # lm-engine's plain 1/head_dim attention they differ by 0.03 at the larger rate)
    assert mup["losses"]["16"] == pytest.approx(sp["losses"]["16"], abs=1.5e-4)
    assert mup["losses"]["32"] != pytest.approx(sp["losses"]["32"], abs=1.5e-4)  # and twice as wide, not
    for side in (sp, mup):
        assert set(side["best_rate"]) == {"16", "32"} and side["best_rate_spread"] in (1.0, 4.0)
        assert side["loss_at_base_rate"][0] == min(side["losses"]["16"])
    assert record["mup_transfers"] == (mup["best_rate_spread"] <= 2 and not mup["loss_rises_with_width"])
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
