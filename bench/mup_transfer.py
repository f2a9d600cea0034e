"""muP transfer, shown: the learning rate swept over widths, with muP and with the standard
parametrization (SP), and the classic figure (held-out loss against the rate, one curve per width,
the two side by side).

Each width trains dew's ``transformer`` (the same depth, heads and tokens at every width; head_dim
grows with the width, as in muP's own experiments) built by the architecture registry, with the
optimizer ``build_optimizer`` makes of the run's ``OptimConfig``; under muP its parameter groups are
the ones ``model.config.mup=true`` brings (``dew.training.optim.mup.mup_groups`` at the model's own width
multiplier). muP's base width is dew's default, 256, where ``init_std`` 0.02 is the usual relative
scale and where muP is the standard model exactly; muP carries that model's initialisation and rate
to the narrower widths (docs/mup.md says why the base matters). The data is byte-level
(``ByteTokenizer``) Python source: the ``.py`` files of dew's installed dependencies, every tenth
file held out for the evaluation, so nothing is downloaded. Every run sees the same batches.

One program per width and parametrization trains every rate at once: the parameters are stacked
on a leading axis and the step is ``vmap``ped over it. The optimizer is built at rate 1 and each
copy's update multiplied by its rate, which is the optimizer at that rate exactly: AdamW's update,
its decoupled decay and the schedule are all linear in the peak rate (docs/optimizers.md).

    JAX_PLATFORMS=cpu python bench/mup_transfer.py [--widths 32,64,128,256 --base-width 256 --steps 150
                                                    --figure docs/images/mup_transfer.png]

The last line printed is JSON: {"bench": "mup_transfer", "mup": {...}, "sp": {...}, ...}, with each
parametrization's best rate and loss per width and the two criteria (the muP optimum within a factor
of 2 across widths; at the narrowest width's best rate the loss never rises with width).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dew.contract.config import OptimConfig
from dew.contract.models import build, of
from dew.contract.schedules import schedules
from dew.data.tokenizer import ByteTokenizer
from dew.training.optim.build import build_optimizer
from dew.training.optim.mup import mup_groups

PACKAGES = ("optax", "flax", "orbax", "hydra", "omegaconf")
"""Whose ``.py`` files are the corpus: dew's own dependencies, installed wherever dew is."""


# ------------------------------------------------------------------------------------------- data


def corpus(max_train: int, max_eval: int) -> tuple[np.ndarray, np.ndarray]:
    """Byte tokens of the packages' source files, each file followed by the end-of-text id:
    every tenth file (in sorted order) is held out for evaluation."""
    import importlib.util

    tokenizer = ByteTokenizer()
    files = []
    for name in PACKAGES:
        for root in importlib.util.find_spec(name).submodule_search_locations:
            files += sorted(p for p in Path(root).rglob("*.py") if "test" not in p.name)
    train, held_out = [], []
    sizes = [0, 0]
    for i, path in enumerate(files):
        side, limit = (1, max_eval) if i % 10 == 0 else (0, max_train)
        if sizes[side] >= limit:
            continue
        ids = np.append(tokenizer.encode(path.read_text(errors="replace")), tokenizer.eos_id)
        (held_out if side else train).append(ids)
        sizes[side] += len(ids)
    return np.concatenate(train)[:max_train].astype(np.int32), np.concatenate(held_out)[:max_eval].astype(np.int32)


def windows(tokens: np.ndarray, count: int, seq_len: int, rng: np.random.Generator | None) -> np.ndarray:
    """``count`` windows of ``seq_len + 1`` tokens: at random offsets, or evenly spaced without
    ``rng``."""
    last = len(tokens) - seq_len - 1
    starts = rng.integers(0, last, count) if rng is not None else np.linspace(0, last, count).astype(int)
    return np.stack([tokens[s : s + seq_len + 1] for s in starts])


# ------------------------------------------------------------------------------------------ model


def fields(width: int, mup: bool, args: argparse.Namespace) -> dict:
    return dict(
        vocab_size=ByteTokenizer().vocab_size,
        seq_len=args.seq_len,
        hidden_size=width,
        depth=args.depth,
        num_heads=args.heads,
        mup=mup,
        mup_base_width=args.base_width,
        dtype="float32",
        remat="none",
    )


def optim_config(model_fields: dict, params, args: argparse.Namespace) -> OptimConfig:
    """The run's optimizer at rate 1, with muP's groups when the model has muP on."""
    config = OptimConfig(
        optimizer="adamw",
        learning_rate=1.0,
        weight_decay=args.weight_decay,
        schedule=schedules["cosine"](warmup_steps=args.steps // 10, floor_ratio=0.1),
    )
    multiplier = of("transformer", model_fields).mup_width_multiplier()
    if multiplier is None:
        return config
    from dataclasses import replace

    return replace(config, param_groups=mup_groups(config, params, multiplier))


def next_token_loss(graphdef, params, tokens):
    logits = nnx.merge(graphdef, params)(tokens[:, :-1]).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def sweep(
    width: int, mup: bool, rates: list[float], train: np.ndarray, held_out: np.ndarray, args: argparse.Namespace
) -> list[float]:
    """Held-out loss after ``args.steps`` steps at each rate (nan where a run diverged)."""
    model_fields = fields(width, mup, args)
    graphdef, params = nnx.split(build("transformer", model_fields, nnx.Rngs(params=args.seed)))
    tx = build_optimizer(optim_config(model_fields, params, args), params, total_steps=args.steps).tx
    stack = jax.tree.map(lambda x: jnp.broadcast_to(x, (len(rates), *x.shape)), params)
    opt_state = jax.vmap(tx.init)(stack)

    def one(params, opt_state, rate, batch):
        loss, grads = jax.value_and_grad(lambda p: next_token_loss(graphdef, p, batch))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        updates = jax.tree.map(lambda u: rate * u, updates)  # the optimizer at this rate (linear in it)
        return optax.apply_updates(params, updates), opt_state, loss

    step = jax.jit(jax.vmap(one, in_axes=(0, 0, 0, None)), donate_argnums=(0, 1))
    evaluate = jax.jit(jax.vmap(lambda p, b: next_token_loss(graphdef, p, b), in_axes=(0, None)))
    lr = jnp.asarray(rates, jnp.float32)
    for batch in train:
        stack, opt_state, _loss = step(stack, opt_state, lr, batch)
    losses = np.mean([np.asarray(evaluate(stack, batch)) for batch in held_out], axis=0)
    return [float(x) if math.isfinite(x) else float("nan") for x in losses]


# ---------------------------------------------------------------------------------------- results


def optimum(rates: list[float], losses: list[float]) -> tuple[float, float]:
    """The best rate of a sweep and its loss."""
    finite = [(loss, rate) for rate, loss in zip(rates, losses, strict=True) if math.isfinite(loss)]
    loss, rate = min(finite)
    return rate, loss


def summary(rates: list[float], results: dict[int, list[float]]) -> dict:
    """Each width's best rate and loss; the spread of the best rates (largest over smallest); and
    the loss at the narrowest width's best rate, width by width, with whether it ever rises."""
    widths = sorted(results)
    best = {w: optimum(rates, results[w]) for w in widths}
    base_rate = best[widths[0]][0]
    at_base = [results[w][rates.index(base_rate)] for w in widths]
    rises = any(not (b <= a) for a, b in itertools.pairwise(at_base))
    return {
        "best_rate": {str(w): best[w][0] for w in widths},
        "best_loss": {str(w): round(best[w][1], 4) for w in widths},
        "best_rate_spread": max(b[0] for b in best.values()) / min(b[0] for b in best.values()),
        "base_rate": base_rate,
        "loss_at_base_rate": [round(x, 4) for x in at_base],
        "loss_rises_with_width": rises,
        "losses": {str(w): [round(x, 4) for x in results[w]] for w in widths},
    }


def draw(path: str, rates: list[float], results: dict[str, dict[int, list[float]]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    finite = [x for r in results.values() for losses in r.values() for x in losses if math.isfinite(x)]
    top = min(max(finite), min(finite) + 1.5)
    colors = plt.cm.viridis(np.linspace(0.0, 0.85, len(next(iter(results.values())))))
    for ax, (label, by_width) in zip(axes, results.items(), strict=True):
        for color, (width, losses) in zip(colors, sorted(by_width.items()), strict=True):
            ax.plot(rates, losses, "o-", color=color, label=f"width {width}", markersize=4)
            rate, loss = optimum(rates, losses)
            ax.plot([rate], [loss], "*", color=color, markersize=13, markeredgecolor="black")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("learning rate (AdamW peak)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out loss (nats / byte)")
    axes[0].set_ylim(min(finite) - 0.05, top)
    axes[1].legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="32,64,128,256", help="comma-separated")
    parser.add_argument(
        "--base-width",
        type=int,
        default=256,
        help="muP's base width (model.config.mup_base_width), where muP is the standard model",
    )
    parser.add_argument(
        "--rates", default="-12,-11,-10,-9,-8,-7,-6,-5", help="the learning rates as powers of two, comma-separated"
    )
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--eval-batches", type=int, default=16)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--figure", default="docs/images/mup_transfer.png", help="where the figure goes ('' for none)")
    args = parser.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    rates = [2.0 ** int(k) for k in args.rates.split(",")]

    start = time.perf_counter()
    train_tokens, eval_tokens = corpus(max_train=4_000_000, max_eval=400_000)
    rng = np.random.default_rng(args.seed)
    train = windows(train_tokens, args.steps * args.batch, args.seq_len, rng).reshape(args.steps, args.batch, -1)
    held_out = windows(eval_tokens, args.eval_batches * args.batch, args.seq_len, None).reshape(
        args.eval_batches, args.batch, -1
    )
    results: dict[str, dict[int, list[float]]] = {"sp": {}, "mup": {}}
    for width in widths:
        for label in results:
            t0 = time.perf_counter()
            results[label][width] = sweep(width, label == "mup", rates, train, held_out, args)
            print(
                f"mup_transfer: {label} width {width}: {time.perf_counter() - t0:.0f} s, held-out loss "
                + " ".join(f"{x:.3f}" for x in results[label][width]),
                flush=True,
            )
    record = {
        "bench": "mup_transfer",
        "widths": widths,
        "rates": rates,
        "setup": {
            k: getattr(args, k)
            for k in ("base_width", "depth", "heads", "seq_len", "batch", "steps", "weight_decay", "seed")
        },
        "train_tokens": len(train_tokens),
        "eval_tokens": len(eval_tokens),
        "sp": summary(rates, results["sp"]),
        "mup": summary(rates, results["mup"]),
    }
    record["mup_transfers"] = record["mup"]["best_rate_spread"] <= 2 and not record["mup"]["loss_rises_with_width"]
    record["seconds"] = round(time.perf_counter() - start, 1)
    if args.figure:
        draw(
            args.figure,
            rates,
            {"standard parametrization": results["sp"], "muP": results["mup"]},
            f"dew transformer, depth {args.depth}, {args.heads} heads, {args.steps} steps of "
            f"{args.batch}x{args.seq_len} byte tokens of Python source; muP's base width {args.base_width}; "
            "the star is each width's best rate",
        )
        record["figure"] = args.figure
    print(json.dumps(record))
    return record


if __name__ == "__main__":
    main()
