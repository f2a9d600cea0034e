"""Writing samples of a trained run to its directory: a PNG grid for images, a text file for tokens
(``dew-train`` at the end of a run, ``dew-sample``, the run report). Everything goes through epath,
so a run directory on any filesystem epath reaches (gs://) takes them."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from etils import epath

from dew.contract.rundir import SAMPLE_PREFIX

if TYPE_CHECKING:
    from flax import nnx


def write_sample_grid(
    objective: Any, model: nnx.Module, run_dir: str | os.PathLike[str], *, seed: int, name: str = f"{SAMPLE_PREFIX}.png"
) -> str:
    """A PNG grid of class-conditional samples, one row per class, in ``run_dir``; ``objective`` is an
    image objective (its own ``sample_grid``)."""
    images, labels = objective.sample_grid(model, jax.random.PRNGKey(seed + 3))
    rows = max(int(labels.max()) + 1, 1)
    return write_grid(os.fspath(run_dir) + "/" + name, images, rows=rows, scale=4)


def write_text_samples(
    objective: Any, model: nnx.Module, run_dir: str | os.PathLike[str], *, seed: int, name: str = f"{SAMPLE_PREFIX}.txt"
) -> str:
    """The objective's ``samples`` knob of sequences, decoded, one block each, in ``run_dir``;
    ``objective`` is a text objective (its own ``sample_text``)."""
    _, texts = objective.sample_text(model, jax.random.PRNGKey(seed + 3))
    path = os.fspath(run_dir) + "/" + name
    epath.Path(path).write_text("".join(f"--- sample {i} ---\n{text}\n" for i, text in enumerate(texts)))
    return path


def to_uint8(images: np.ndarray) -> np.ndarray:
    """[-1, 1] floats to uint8 pixels."""
    return np.clip(np.round((images + 1.0) * 127.5), 0, 255).astype(np.uint8)


def write_grid(path: str, images: np.ndarray, rows: int, scale: int = 1) -> str:
    """Write uint8 images (N, H, W, C) as one PNG grid with ``rows`` rows."""
    from PIL import Image

    n, h, w, c = images.shape
    cols = -(-n // rows)
    pad = 1
    grid = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, c), 255, np.uint8)
    for i, img in enumerate(images):
        r, col = divmod(i, cols)
        grid[pad + r * (h + pad) : pad + r * (h + pad) + h, pad + col * (w + pad) : pad + col * (w + pad) + w] = img
    picture = Image.fromarray(grid[..., 0] if c == 1 else grid)
    if scale > 1:
        picture = picture.resize((picture.width * scale, picture.height * scale), Image.Resampling.NEAREST)
    with epath.Path(path).open("wb") as f:  # through epath: a gs:// run directory takes it too
        picture.save(f, format="PNG")
    return path
