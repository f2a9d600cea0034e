"""Where ``hf_text`` and ``dew-prepare --hf/--jsonl/--parquet`` read text from: a Hugging Face dataset.

A source is one of four things, told apart by what ``path`` is:

- a directory ``Dataset.save_to_disk`` (or ``DatasetDict.save_to_disk``) wrote: ``load_from_disk``;
- another directory: a dataset repository as the hub holds one (data files, their splits named by
  the files or folders, ``train``/``test``/``validation``, or by the card's ``configs``), cloned or
  copied here: ``load_dataset(directory)``;
- data files, a path or a glob (``.jsonl``/``.json``, ``.parquet``, ``.csv``, ``.txt``): the
  ``datasets`` builder of their format (``json``, ``parquet``, ``csv``, ``text``; a ``.txt`` file's
  records are its lines, in the column ``text``), one split, ``train``;
- otherwise a hub dataset name, read from the local hub cache with the hub offline
  (``HF_DATASETS_OFFLINE``): dew never downloads a dataset.

This module imports ``datasets`` (about 1.5 s) only when a source is opened.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import datasets

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}
"""The ``datasets`` builder of each data-file suffix."""
DISK_MARKERS = ("state.json", "dataset_dict.json", "dataset_info.json")
"""Files one of which a ``save_to_disk`` directory holds."""


def _offline() -> None:
    """The hub stays offline for every source: a name not in the local cache fails, nothing is fetched.
    The library's progress bars are off."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if importlib.util.find_spec("datasets") is None:
        raise ValueError(
            "Hugging Face datasets need the datasets package, which is not installed: pip install 'dew[data]'"
        )
    import datasets.config  # heavy: the datasets library loads only when a source is opened

    datasets.config.HF_DATASETS_OFFLINE = True
    datasets.config.HF_HUB_OFFLINE = True
    datasets.disable_progress_bars()  # dew says what it does in its log; bars would interleave with it


@dataclasses.dataclass(frozen=True)
class Source:
    """One split of a dataset, and the column that holds its text."""

    kind: Literal["disk", "repo", "files", "hub"]
    path: str
    """The directory (``disk``, ``repo``), the glob as given (``files``) or the hub name (``hub``)."""
    split: str
    field: str
    files: tuple[str, ...] = ()
    """The data files, sorted (``files``)."""
    builder: str | None = None
    """The ``datasets`` builder of the files (``files``)."""
    subset: str | None = None
    """A hub dataset's configuration."""
    what: str = "data.path"
    """The option that named the source, for errors."""

    def __str__(self) -> str:
        return f"{self.what}={self.path!r}" + (f" (split {self.split!r})" if self.kind != "files" else "")

    def identity(self) -> dict[str, object]:
        """What the cache is keyed by: the source's files with their sizes and modification times (so a
        changed file makes a new cache), or, for a hub dataset, its name, configuration and fingerprint."""
        if self.kind == "hub":
            return {
                "hub": self.path,
                "subset": self.subset,
                "split": self.split,
                "fingerprint": self.open()._fingerprint,
            }
        if self.kind == "files":
            files = list(self.files)
        else:
            files = sorted(
                os.path.join(d, f)
                for d, _, names in os.walk(self.path)
                if not os.path.relpath(d, self.path).startswith(".")  # .git and the like
                for f in names
                if not f.startswith(".")
            )
        return {
            "kind": self.kind,
            "split": self.split,
            "files": [(os.path.abspath(f), os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files],
        }

    def open(self) -> datasets.Dataset:
        """The split as a ``datasets.Dataset`` (memory-mapped Arrow), its text column checked."""
        _offline()
        import datasets  # heavy: the datasets library loads only when a source is opened

        if self.kind == "disk":
            try:
                loaded = datasets.load_from_disk(self.path)
            except Exception as e:  # an empty or damaged directory fails deep inside the library
                raise ValueError(f"{self}: cannot be read ({type(e).__name__}: {e}); empty, or not whole") from None
            if isinstance(loaded, datasets.DatasetDict):
                if self.split not in loaded:
                    raise ValueError(f"{self}: no split {self.split!r}; it has {', '.join(loaded)}")
                loaded = loaded[self.split]
        elif self.kind == "files":
            if not any(os.path.getsize(f) for f in self.files):
                raise ValueError(f"{self}: the files are empty: the split holds no records")
            try:
                loaded = datasets.load_dataset(self.builder, data_files=list(self.files), split="train")
            except Exception as e:  # pyarrow and the builders raise many kinds on a malformed file
                if "corresponds to no data" in str(e):
                    raise ValueError(f"{self}: the split holds no records") from None
                raise ValueError(f"{self}: cannot be read as {self.builder} ({type(e).__name__}: {e})") from None
        else:
            try:
                loaded = datasets.load_dataset(self.path, self.subset, split=self.split)
            except (FileNotFoundError, ConnectionError, ValueError) as e:
                if self.kind == "repo":
                    raise ValueError(f"{self}: cannot be read as a dataset repository ({e})") from None
                raise FileNotFoundError(
                    f"{self}: not a save_to_disk directory, no data file, and not a dataset in the local hub cache "
                    f"(the hub is not reached: download it first, or save it with save_to_disk) ({e})"
                ) from None
        assert isinstance(loaded, datasets.Dataset)
        self.check(loaded.column_names)
        if len(loaded) == 0:
            raise ValueError(f"{self}: the split holds no records")
        return loaded

    def stream(self) -> datasets.IterableDataset:
        """The split as a ``datasets.IterableDataset``: read as it is iterated, never converted whole."""
        _offline()
        import datasets  # heavy: the datasets library loads only when a source is opened

        if self.kind == "disk":
            return self.open().to_iterable_dataset(num_shards=len(self.open().cache_files) or 1)
        if self.kind == "files":
            stream = datasets.load_dataset(self.builder, data_files=list(self.files), split="train", streaming=True)
        else:
            try:
                stream = datasets.load_dataset(self.path, self.subset, split=self.split, streaming=True)
            except (FileNotFoundError, ConnectionError, ValueError) as e:
                if self.kind == "repo":
                    raise ValueError(f"{self}: cannot be read as a dataset repository ({e})") from None
                raise FileNotFoundError(f"{self}: not in the local hub cache (the hub is not reached) ({e})") from None
        if stream.column_names is not None:
            self.check(stream.column_names)
        return stream

    def check(self, columns: list[str]) -> None:
        if self.field not in columns:
            raise ValueError(f"data.field={self.field!r}: {self} has no such column; it has {', '.join(columns)}")


def text_of(source: Source, record: dict, index: int) -> str:
    """The text of one record, or an error naming the record and the field."""
    if source.field not in record:
        raise ValueError(f"data.field={source.field!r}: record {index} of {source} has no such field")
    text = record[source.field]
    if not isinstance(text, str):
        raise ValueError(
            f"data.field={source.field!r}: record {index} of {source} holds {type(text).__name__}, not text"
        )
    return text


def texts(source: Source, batch: int = 1024) -> Iterator[list[str]]:
    """The split's texts in their stored order, ``batch`` records at a time (one Arrow read each)."""
    data = source.open()
    for start in range(0, len(data), batch):
        column = data[start : start + batch][source.field]
        for i, text in enumerate(column):
            if not isinstance(text, str):
                raise ValueError(
                    f"data.field={source.field!r}: record {start + i} of {source} holds {type(text).__name__}, not text"
                )
        yield column


def resolve(
    path: str,
    *,
    split: str = "train",
    field: str = "text",
    subset: str | None = None,
    fmt: str = "auto",
    what: str = "data.path",
) -> Source:
    """The source ``path`` names (see the module docstring); errors name ``what``."""
    if not path:
        raise ValueError(f"{what} is empty: give a save_to_disk directory, data files or a hub dataset name")
    expanded = os.path.expanduser(path)
    if os.path.isdir(expanded):
        if any(os.path.isfile(os.path.join(expanded, m)) for m in DISK_MARKERS):
            return Source("disk", expanded, split, field, what=what)
        return Source("repo", expanded, split, field, subset=subset, what=what)
    files = tuple(sorted(f for f in glob.glob(expanded) if os.path.isfile(f)))
    if files:
        if fmt != "auto":
            builder = fmt
        else:
            suffixes = {os.path.splitext(f)[1].lower() for f in files}
            unknown = sorted(s or "(none)" for s in suffixes if s not in FORMATS)
            if unknown:
                raise ValueError(
                    f"{what}={path!r}: files with suffix {', '.join(unknown)}; data files are "
                    f"{', '.join(FORMATS)} (or set data.format)"
                )
            builders = {FORMATS[s] for s in suffixes}
            if len(builders) > 1:
                raise ValueError(f"{what}={path!r} mixes formats {', '.join(sorted(builders))}: give one")
            builder = builders.pop()
        if split != "train":
            raise ValueError(
                f"data.split={split!r}: data files are one split, 'train'; hold out text with data.val_path"
            )
        if builder == "text" and field != "text":
            raise ValueError(f"data.field={field!r}: the records of .txt files are their lines, in the field 'text'")
        return Source("files", path, split, field, files, builder, what=what)
    if any(c in path for c in "*?[") or os.sep in path.strip("/").split("/", 1)[-1] or path.startswith((".", "/", "~")):
        raise FileNotFoundError(f"{what}={path!r} matches no file and no save_to_disk directory")
    return Source("hub", path, split, field, subset=subset, what=what)
