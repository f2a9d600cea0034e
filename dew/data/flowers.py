"""``oxford_flowers102``: Nilsback & Zisserman's 8,189 flower images of 102 classes.

The official files (``102flowers.tgz`` with ``jpg/image_00001.jpg``..., ``imagelabels.mat`` with
``labels`` 1..102, ``setid.mat`` with the 1-based image ids of ``trnid``, ``valid``, ``tstid``) come
from ``data.root`` or are downloaded once into ``<cache>/oxford_flowers102/`` and checked against
their published MD5s. The images are decoded straight from the archive (nothing is written under
the archive's member names, and a member whose path would leave the directory is refused),
centre-cropped to a square, resized to ``data.resolution`` and cached as one uint8 array
``(N, R, R, 3)`` that every later run memory-maps. The cache is built in a temporary directory and
renamed into place only when complete, so a failed or interrupted build leaves nothing half-cached.

``<cache>`` is ``data.cache_dir``, else ``$DEW_DATA_DIR``, else ``~/.cache/dew/datasets``.
Batches: ``image`` float32 in [-1, 1] (``pixel / 127.5 - 1``), NHWC; ``label`` int32 in [0, 102).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import json
import os
import posixpath
import re
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from typing import TYPE_CHECKING

import numpy as np
import scipy.io
from PIL import Image

from dew.contract.data import Batch
from dew.data.pipeline import ArrayRecords, RecordDataset

if TYPE_CHECKING:
    from dew.data.fields import OxfordFlowers102Fields


NUM_CLASSES = 102
BASE_URL = "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/"
ARCHIVE, LABELS, SETID = "102flowers.tgz", "imagelabels.mat", "setid.mat"
CHECKSUMS = {  # MD5s published with the dataset (and used by torchvision's Flowers102)
    ARCHIVE: "52808999861908f626f3c1f4e79d11fa",
    LABELS: "e0620be6f572b9609742df49c70aed4d",
    SETID: "a5357ecc9cb78c4bef273ce3793fc85c",
}
SPLIT_KEYS = {"train": "trnid", "val": "valid", "test": "tstid"}
_MEMBER = re.compile(r"^jpg/image_(\d{5})\.jpg$")
_CACHE_VERSION = 1


def cache_root(spec: OxfordFlowers102Fields) -> str:
    """Where this dataset's downloads and arrays live."""
    base = spec.cache_dir or os.environ.get("DEW_DATA_DIR") or "~/.cache/dew/datasets"
    return os.path.join(os.path.expanduser(base), spec.name)


def md5sum(path: str) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(name: str, directory: str) -> str:
    """``BASE_URL + name`` saved as ``directory/name`` once its MD5 matches; the path."""
    path = os.path.join(directory, name)
    if os.path.isfile(path):
        return path  # only a verified download is ever renamed to this name
    os.makedirs(directory, exist_ok=True)
    url = BASE_URL + name
    part = f"{path}.part-{os.getpid()}"
    try:
        try:
            with urllib.request.urlopen(url, timeout=60) as response, open(part, "wb") as f:
                shutil.copyfileobj(response, f, length=1 << 20)
        except (urllib.error.URLError, OSError) as e:
            raise ConnectionError(
                f"could not download {url} ({e}). Without network, download {ARCHIVE}, {LABELS} "
                f"and {SETID} from {BASE_URL} elsewhere and put them in {directory} (or in a "
                "directory named by data.root)"
            ) from e
        got = md5sum(part)
        if got != CHECKSUMS[name]:
            raise ValueError(
                f"{url}: downloaded file has MD5 {got}, expected {CHECKSUMS[name]}: "
                "corrupt or truncated download, not kept"
            )
        os.replace(part, path)
    finally:
        if os.path.exists(part):
            os.remove(part)
    return path


def source_files(spec: OxfordFlowers102Fields) -> dict[str, str]:
    """The three official files: from ``data.root``, else the cache, downloading what is missing."""
    if spec.root is not None:
        root = os.path.expanduser(spec.root)
        paths = {n: os.path.join(root, n) for n in (ARCHIVE, LABELS, SETID)}
        missing = [p for p in paths.values() if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(
                f"data.root={spec.root!r} lacks {', '.join(missing)}: it must hold {ARCHIVE}, "
                f"{LABELS} and {SETID} as published at {BASE_URL}"
            )
        return paths
    directory = os.path.join(cache_root(spec), "downloads")
    return {n: download(n, directory) for n in (ARCHIVE, LABELS, SETID)}


def _mat_field(path: str, key: str) -> np.ndarray:
    try:
        contents = scipy.io.loadmat(path)
    except Exception as e:  # scipy raises ValueError, TypeError, OSError... for a damaged file
        raise ValueError(f"{path}: not a readable .mat file, corrupt or truncated ({e})") from e
    if key not in contents:
        found = sorted(k for k in contents if not k.startswith("__"))
        raise ValueError(f"{path}: has no variable {key!r} (found {found})")
    return np.asarray(contents[key]).reshape(-1).astype(np.int64)


def center_crop_resize(data: bytes, resolution: int) -> np.ndarray:
    """One JPEG decoded, centre-cropped to its shorter side and resized to ``resolution``."""
    image: Image.Image = Image.open(io.BytesIO(data))
    image.draft("RGB", (2 * resolution, 2 * resolution))  # decode at a reduced DCT scale
    image = image.convert("RGB")
    w, h = image.size
    side = min(w, h)
    left, top = (w - side) // 2, (h - side) // 2
    image = image.crop((left, top, left + side, top + side))
    image = image.resize((resolution, resolution), Image.Resampling.BICUBIC)
    return np.asarray(image, np.uint8)


def read_archive(path: str) -> dict[int, bytes]:
    """The JPEG bytes of ``path`` by 1-based image id, refusing members that leave the directory."""
    jpegs: dict[int, bytes] = {}
    try:
        with tarfile.open(path, "r:gz") as archive:
            for member in archive:
                name = member.name
                normal = posixpath.normpath(name)
                if name.startswith("/") or normal.startswith("..") or member.issym() or member.islnk():
                    raise ValueError(
                        f"{path}: member {name!r} would leave the target directory "
                        "(absolute, '..' or a link): refusing the archive"
                    )
                match = _MEMBER.match(normal)
                if match and member.isfile():
                    file = archive.extractfile(member)
                    assert file is not None  # a regular file's member always has one
                    jpegs[int(match.group(1))] = file.read()
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise ValueError(f"{path}: corrupt or truncated archive ({e})") from e
    if not jpegs:
        raise ValueError(f"{path}: holds no jpg/image_NNNNN.jpg member")
    return jpegs


def build_cache(files: dict[str, str], resolution: int, directory: str) -> None:
    """Decode the official files into ``directory`` (images.npy, labels.npy, splits.json)."""
    labels = _mat_field(files[LABELS], "labels")
    splits = {split: _mat_field(files[SETID], key) for split, key in SPLIT_KEYS.items()}
    n = len(labels)
    if labels.min(initial=1) < 1 or labels.max(initial=1) > NUM_CLASSES:
        raise ValueError(
            f"{files[LABELS]}: labels must lie in [1, {NUM_CLASSES}], got [{labels.min()}, {labels.max()}]"
        )
    for split, ids in splits.items():
        bad = ids[(ids < 1) | (ids > n)]
        if len(bad):
            raise ValueError(
                f"{files[SETID]}: {SPLIT_KEYS[split]} names image {int(bad[0])}, but "
                f"{files[LABELS]} labels images 1..{n}"
            )
    jpegs = read_archive(files[ARCHIVE])
    missing = sorted(set(range(1, n + 1)) - set(jpegs))
    if missing:
        raise ValueError(
            f"{files[ARCHIVE]}: lacks jpg/image_{missing[0]:05d}.jpg (and "
            f"{len(missing) - 1} more) that {files[LABELS]} labels"
        )

    def decode(image_id: int) -> np.ndarray:
        try:
            return center_crop_resize(jpegs[image_id], resolution)
        except (OSError, ValueError, Image.DecompressionBombError) as e:
            raise ValueError(f"{files[ARCHIVE]}: jpg/image_{image_id:05d}.jpg is not a readable JPEG ({e})") from e

    images = np.lib.format.open_memmap(
        os.path.join(directory, "images.npy"), mode="w+", dtype=np.uint8, shape=(n, resolution, resolution, 3)
    )
    # PIL releases the GIL while decoding, so threads decode in parallel.
    with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        for i, pixels in enumerate(pool.map(decode, range(1, n + 1))):
            images[i] = pixels
    images.flush()
    del images
    np.save(os.path.join(directory, "labels.npy"), (labels - 1).astype(np.int32))
    with open(os.path.join(directory, "splits.json"), "w") as f:
        json.dump({s: sorted(int(i) - 1 for i in ids) for s, ids in splits.items()}, f)


def cached_arrays(spec: OxfordFlowers102Fields) -> str:
    """The directory of the decoded arrays for ``spec``, building it if absent."""
    files = source_files(spec)
    # Keyed by the source files' identity and the resolution: other files get another cache.
    identity = json.dumps([[os.path.abspath(p), os.path.getsize(p), os.stat(p).st_mtime_ns] for p in files.values()])
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    directory = os.path.join(cache_root(spec), f"v{_CACHE_VERSION}-r{spec.resolution}-{key}")
    if os.path.isdir(directory):
        return directory
    os.makedirs(cache_root(spec), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".building-", dir=cache_root(spec))
    try:
        build_cache(files, spec.resolution, tmp)
        try:
            os.replace(tmp, directory)
        except OSError:  # another process finished the same cache first
            if not os.path.isdir(directory):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def _decode(raw: Batch) -> Batch:
    image = raw["image"].astype(np.float32) * (1.0 / 127.5) - 1.0
    return {"image": image, "label": raw["label"]}


def load_flowers(spec: OxfordFlowers102Fields, batch_size: int, seed: int) -> RecordDataset:
    """Oxford Flowers 102 at global batch ``batch_size``, shuffled from ``seed``."""
    directory = cached_arrays(spec)
    images = np.load(os.path.join(directory, "images.npy"), mmap_mode="r")
    labels = np.load(os.path.join(directory, "labels.npy"))
    with open(os.path.join(directory, "splits.json")) as f:
        splits = json.load(f)
    arrays = {"image": images, "label": labels}
    train = np.unique(np.concatenate([splits[s] for s in spec.train_splits])).astype(np.int64)
    held_out = np.asarray(splits[spec.eval_split], np.int64)
    return RecordDataset(
        name=spec.name,
        train=ArrayRecords(arrays, _decode, train),
        held_out=ArrayRecords(arrays, _decode, held_out),
        batch_size=batch_size,
        seed=seed,
        fields={"input_size": spec.resolution, "in_channels": 3, "num_classes": NUM_CLASSES},
    )
