"""A folder of generated images for the image dataset tests: four classes, each its own shape and
colour, drawn with Pillow at a few sizes and in PNG, JPEG and WebP."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw

CLASSES = {"bar": (230, 210, 40), "circle": (220, 40, 40), "square": (40, 200, 60), "triangle": (40, 80, 230)}
"""Each class's name and fill colour; the sorted names are the labels 0..3."""
FORMATS = ("png", "jpg", "webp")


def draw(name: str, rng: np.random.Generator, size: int = 24) -> Image.Image:
    """One image of class ``name``: its shape in its colour on a dark ground, placed and sized at random."""
    width = size + int(rng.integers(0, 9))  # not square: the centre crop has work to do
    image = Image.new("RGB", (width, size), tuple(int(v) for v in rng.integers(0, 40, 3)))
    pen = ImageDraw.Draw(image)
    shift, fill = int(rng.integers(-3, 4)), CLASSES[name]
    cx, cy = width // 2 + shift, size // 2 + int(rng.integers(-2, 3))
    r = size // 3 + int(rng.integers(-2, 2))
    if name == "circle":
        pen.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif name == "square":
        pen.rectangle((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif name == "triangle":
        pen.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
    else:
        pen.rectangle((0, cy - r // 3, width, cy + r // 3), fill=fill)
    return image


def write_shapes(root: Path, per_class: int, *, split: str | None = None, seed: int = 0) -> Path:
    """``root[/split]/<class>/<i>.<png|jpg|webp>``, ``per_class`` images of each class; ``root``."""
    rng = np.random.default_rng(seed)
    for name in CLASSES:
        folder = root / split / name if split else root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            draw(name, rng).save(folder / f"{i:04d}.{FORMATS[i % len(FORMATS)]}")
    return root


def write_parquet(path: Path, per_class: int, *, seed: int = 0) -> Path:
    """A Parquet file as another tool writes one, read by ``hf_images``: an ``image`` column of
    {bytes, path} records (PNG) and a ``label`` column of class names; ``path``."""
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for i in range(per_class * len(CLASSES)):
        name = sorted(CLASSES)[i % len(CLASSES)]
        buffer = io.BytesIO()
        draw(name, rng).save(buffer, "PNG")
        images.append({"bytes": buffer.getvalue(), "path": f"{i}.png"})
        labels.append(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"image": images, "label": labels}), path)
    return path
