"""muP's coordinate check, drawn: each layer's activation RMS against the width after a few Adam
steps, for dew's ``transformer`` and ``simple_dit``, under the standard parametrization (SP) and under
muP, side by side (``dew.training.optim.coordinate_check`` computes it; its docstring says how).

    JAX_PLATFORMS=cpu python bench/mup_coord_check.py [--widths 48,96,192,384 --learning-rate 3e-3
                                                       --steps 5 --seeds 4 --figures docs/images]

writes ``mup_coord_transformer.png`` and ``mup_coord_dit.png`` into ``--figures``; the last line printed
is JSON: {"bench": "mup_coord_check", "transformer": {"sp": {...}, "mup": {...}}, "simple_dit": ...},
each with every layer's RMS per width and its slope of log RMS against log width.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from dew.training.optim.coordinate_check import CoordinateCheck, coordinate_check

MODELS = {
    "transformer": dict(vocab_size=64, seq_len=16, depth=2, num_heads=4, dtype="float32", remat="none"),
    "simple_dit": dict(
        input_size=8, in_channels=1, patch_size=2, depth=2, num_heads=4, num_classes=4, dtype="float32", remat="none"
    ),
}
"""The tests' models (tests/training/optim/test_mup_coord.py): 2 blocks of 4 heads; the transformer on
64-token sequences of 16, the DiT on 8x8 one-channel images in 2x2 patches with 4 classes."""

FIGURES = {"transformer": "mup_coord_transformer.png", "simple_dit": "mup_coord_dit.png"}


def draw(checks: dict[str, CoordinateCheck], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, (label, check) in zip(axes, checks.items(), strict=True):
        for name, values in sorted(check.rms.items()):
            style = dict(linewidth=2.5, color="black") if name == "output" else {}
            ax.plot(check.widths, values, marker="o", label=f"{name} ({check.slopes[name]:+.2f})", **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(check.widths, [str(w) for w in check.widths])
        ax.set_xlabel("width (hidden_size)")
        ax.set_title(f"{check.architecture}, {label}: after {check.steps} Adam steps at {check.learning_rate:g}")
        ax.legend(fontsize=7, title="layer (slope)", title_fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("activation RMS (mean of seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="48,96,192,384")
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--figures", type=Path, default=Path("docs/images"))
    args = parser.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    record: dict = {"bench": "mup_coord_check", "widths": widths}
    start = time.perf_counter()
    for architecture, fields in MODELS.items():
        fields = {**fields, "mup_base_width": widths[0]}
        checks = {
            label: coordinate_check(
                architecture,
                fields,
                widths,
                mup=mup,
                steps=args.steps,
                learning_rate=args.learning_rate,
                seeds=args.seeds,
            )
            for label, mup in (("SP", False), ("muP", True))
        }
        args.figures.mkdir(parents=True, exist_ok=True)
        draw(checks, args.figures / FIGURES[architecture])
        record[architecture] = {label.lower(): check.record() for label, check in checks.items()}
        for label, check in checks.items():
            print(f"{architecture} {label}: " + ", ".join(f"{n} {s:+.3f}" for n, s in sorted(check.slopes.items())))
    record["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(record))
    return record


if __name__ == "__main__":
    main()
