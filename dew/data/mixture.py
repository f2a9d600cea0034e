"""``mixture``: several token datasets mixed at given weights, one source per training sequence.

Which source each sequence of the training stream comes from is a function of the run's seed, the
step and the sequence's position in the stream, nothing else:

- the *counts*: position ``q`` of the stream is given to component ``sources(weights)[q]``, grain's
  proportional selection (``grain.MapDataset.mix`` over one constant label per component): after any
  ``n`` positions each component has had its share ``n * w / sum(w)`` to within one sequence (grain
  scales the weights to whole numbers, the smallest to 100: a share is exact to 1% of the smallest
  weight's), so a batch of 32 at 0.5/0.3/0.2 holds 16, 9 or 10 and 6 or 7 sequences of each;
- the *places*: the rows of the global batch of step ``s`` are then permuted by a permutation drawn
  from ``(seed, s)``, so that where a source's rows sit in the batch (and which process reads them)
  changes from step to step and with the seed.

A stage (``data.stages``) changes the weights from its step on; the positions keep counting, so a
stage's shares are exact from its first batch. Each component reads its rows as it always does, a
batch at a time (``next(count)``): token windows in one vectorised gather, a stream packed as it
reads. Why not grain's mix for the rows too: ``MapDataset.mix`` reads one element per call from
random-access parents (the streams are not), and ``IterDataset.mix`` pulls one element at a time from
each parent's grain iterator; dew's iterators read a batch per call, which is what keeps the token
windows' read path at one gather a batch (dew.data.pipeline).

Every process runs every component's stream whole (each component's iterator is that of process 0 of
1) and keeps its rows of each global batch, as ``text_stream`` does: the global batch, and the saved
position with it, do not depend on the process count, so a run resumes on another process count
with every component (``hf_text``'s stream mode too). The price is that each process reads all the
rows of a global batch: a gather of a few MB a step for token windows, the whole tokenization of the
streams on every process.

The read position (``get_state``) is the mixture's (the stream position and the step) with every
component's own, under its name. Held-out data is each component's own, evaluated component by
component (``eval_sources``: the trainer reports ``eval/<name>/loss``) and, in ``eval_batches``, one
after the other for the values over all of them.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import sys
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grain
import numpy as np

from dew.contract.data import Batch, BatchIterator, Dataset, whole
from dew.data.pipeline import shard_bounds

if TYPE_CHECKING:
    from dew.data.mixture_fields import MixtureFields

_STATE_VERSION = 1


def component_seed(seed: int, name: str) -> int:
    """The seed component ``name`` shuffles from: drawn from the run's seed and the name, so the
    components' orders are independent of each other and of the order they are listed in."""
    return int(np.random.SeedSequence([seed, zlib.crc32(name.encode())]).generate_state(1)[0])


def _label(k: int, _: int) -> int:
    return k


@functools.lru_cache(maxsize=16)
def _selection(weights: tuple[float, ...]) -> grain.MapDataset:
    """Position -> component index at ``weights``: grain's proportional mix of one constant label per
    component with a weight (grain refuses a weight of 0: such a component is left out)."""
    active = [k for k, w in enumerate(weights) if w > 0]
    labels = [grain.MapDataset.range(sys.maxsize).map(functools.partial(_label, k)) for k in active]
    return grain.MapDataset.mix(labels, [weights[k] for k in active])


def draw_sources(weights: Sequence[float], *, seed: int, step: int, position: int, size: int) -> np.ndarray:
    """The component index of each row of the global batch of ``size`` sequences that step ``step``
    reads from stream position ``position`` on, at ``weights`` (one per component)."""
    selection = _selection(tuple(float(w) for w in weights))
    counted = np.fromiter((selection[q] for q in range(position, position + size)), np.int64, size)
    return counted[np.random.default_rng([seed, step]).permutation(size)]


class MixtureIterator(grain.DatasetIterator):
    """One process's part of the mixed stream (see the module docstring)."""

    def __init__(
        self,
        spec: MixtureFields,
        components: Mapping[str, BatchIterator],
        *,
        seed: int,
        batch_size: int,
        process_index: int,
        process_count: int,
    ):
        super().__init__()
        shard_bounds(batch_size, process_index, process_count)  # fail at creation, not at next()
        self._spec, self._components, self._seed = spec, dict(components), seed
        self._batch_size, self._process_index, self._process_count = batch_size, process_index, process_count
        self._step = 0  # batches read
        self._position = 0  # sequences read, over every process

    def next(self, batch_size: int | None = None) -> Batch:
        """This process's rows of the next global batch of ``batch_size`` sequences."""
        size = self._batch_size if batch_size is None else batch_size
        lo, hi = shard_bounds(size, self._process_index, self._process_count)
        weights = self._spec.weights_at(self._step)
        sources = draw_sources(
            list(weights.values()), seed=self._seed, step=self._step, position=self._position, size=size
        )
        out: Batch = {}
        for k, iterator in enumerate(self._components.values()):
            rows = np.flatnonzero(sources == k)
            if not len(rows):
                continue
            for field, values in iterator.next(len(rows)).items():
                if field not in out:
                    out[field] = np.empty((size, *values.shape[1:]), values.dtype)
                out[field][rows] = values
        self._step, self._position = self._step + 1, self._position + size
        return {field: values[lo:hi] for field, values in out.items()}

    def __next__(self) -> Batch:
        return self.next()

    def get_state(self) -> dict[str, Any]:
        """The mixture's position and every component's, JSON-safe and the same on every process."""
        return {
            "version": _STATE_VERSION,
            "dataset": self._spec.name,
            "seed": self._seed,
            "step": self._step,
            "position": self._position,
            "components": {name: dict(it.get_state()) for name, it in self._components.items()},
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continue from a position ``get_state`` returned, refusing one of other components."""
        if state.get("dataset") != self._spec.name or state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"iterator state {dict(state)} was not written by a mixture's iterator (version {_STATE_VERSION})"
            )
        if state.get("seed") != self._seed:
            raise ValueError(f"iterator state has seed={state.get('seed')!r} but this run has seed={self._seed}")
        saved = state.get("components")
        if not isinstance(saved, Mapping) or list(saved) != list(self._components):
            found = list(saved) if isinstance(saved, Mapping) else saved
            raise ValueError(
                f"the checkpoint's mixture has components {found} and this run's has {list(self._components)}: "
                "a mixture resumes with the components it was saved with"
            )
        for key in ("step", "position"):
            if not isinstance(state.get(key), int) or state[key] < 0:
                raise ValueError(f"iterator state {key}={state.get(key)!r} must be an int >= 0")
        for name, iterator in self._components.items():
            iterator.set_state(saved[name])
        self._step, self._position = state["step"], state["position"]


@dataclasses.dataclass
class MixtureDataset:
    """A ``dew.contract.data.Dataset`` over the components' datasets; a stream (``num_records`` None)."""

    spec: MixtureFields
    components: dict[str, Dataset]
    """Name -> the component's dataset, loaded at the mixture's batch size, in the spec's order."""
    batch_size: int
    seed: int
    num_records: int | None = None
    """None: a mixture has no epoch (its length and intervals are given in steps)."""
    resumable: bool = dataclasses.field(init=False)
    tokens_per_record: int = dataclasses.field(init=False)
    """Tokens a sequence contributes to the loss: the components' ``seq_len``."""
    tokenizer: Mapping[str, object] | None = dataclasses.field(init=False)
    """The first component's tokenizer record (they share the vocabulary), for decoding samples."""

    def __post_init__(self) -> None:
        names = list(self.components)
        first = names[0]
        for name in names[1:]:
            _check_same(first, self.components[first], name, self.components[name])
        self.resumable = all(ds.resumable for ds in self.components.values())
        self.tokens_per_record = whole(self.model_fields()["seq_len"], "seq_len")
        records = (getattr(ds, "tokenizer", None) for ds in self.components.values())
        self.tokenizer = next((r for r in records if r is not None), None)

    def batch_spec(self) -> Mapping[str, tuple[tuple[int, ...], np.dtype]]:
        return next(iter(self.components.values())).batch_spec()

    def model_fields(self) -> Mapping[str, object]:
        return next(iter(self.components.values())).model_fields()

    def iterator(self, process_index: int = 0, process_count: int = 1) -> MixtureIterator:
        """A fresh mixed stream; each component's is process 0 of 1 on every process (the module
        docstring says why)."""
        return MixtureIterator(
            self.spec,
            {name: ds.iterator(0, 1) for name, ds in self.components.items()},
            seed=self.seed,
            batch_size=self.batch_size,
            process_index=process_index,
            process_count=process_count,
        )

    @property
    def eval_sources(self) -> tuple[str, ...]:
        """The components that hold data out, each evaluated on its own."""
        return tuple(name for name, ds in self.components.items() if getattr(ds, "num_eval_records", None) != 0)

    @property
    def num_eval_records(self) -> int | None:
        """Held-out records over every component (None where one does not count them)."""
        counts = [getattr(ds, "num_eval_records", None) for ds in self.components.values()]
        return None if None in counts else sum(c for c in counts if c is not None)

    def source_eval_batches(self, process_index: int = 0, process_count: int = 1) -> dict[str, Iterator[Batch]]:
        """Each component's held-out pass (``eval_batches``), by name, for those that hold data out."""
        return {name: self.components[name].eval_batches(process_index, process_count) for name in self.eval_sources}

    def eval_batches(self, process_index: int = 0, process_count: int = 1) -> Iterator[Batch]:
        """Every component's held-out pass, one after the other (each padded to whole batches)."""
        return itertools.chain.from_iterable(self.source_eval_batches(process_index, process_count).values())


def _check_same(first: str, a: Dataset, name: str, b: Dataset) -> None:
    """Refuse a component whose model fields (vocabulary, seq_len) or batch fields differ from the first's."""
    mine, theirs = dict(b.model_fields()), dict(a.model_fields())
    for key in sorted(set(mine) | set(theirs)):
        if mine.get(key) != theirs.get(key):
            raise ValueError(
                f"data.components.{name}: {key}={mine.get(key)!r} but data.components.{first} has {key}="
                f"{theirs.get(key)!r}: every component of a mixture reads windows of one seq_len with one vocabulary"
            )
    shapes, first_shapes = dict(b.batch_spec()), dict(a.batch_spec())
    if shapes != first_shapes:
        raise ValueError(
            f"data.components.{name}: its batches hold {shapes} but data.components.{first}'s hold {first_shapes}"
        )


def _in_component(name: str, kind: str, err: Exception) -> Exception:
    """``err`` (a component's loader's) with the component named in front: the same class where it
    takes one message, else the ValueError or OSError it is."""
    message = f"data.components.{name} ({kind}): {err}"
    try:
        return type(err)(message)
    except TypeError:
        return ValueError(message) if isinstance(err, ValueError) else OSError(message)


def load_mixture(spec: MixtureFields, batch_size: int, seed: int) -> MixtureDataset:
    """Every component of ``spec`` loaded at global batch ``batch_size``, each shuffled from its own
    seed (``component_seed``), checked to share the vocabulary and the window length."""
    if not spec.components:
        raise ValueError(
            "data.components is empty: a mixture needs at least one source "
            "(+data.components.<name>.weight=... with +schema/data@data.components.<name>.data=<dataset>)"
        )
    loaded: dict[str, Dataset] = {}
    for name, component in spec.components.items():
        try:
            loaded[name] = component.data.load(batch_size, component_seed(seed, name))
        except (ValueError, OSError) as err:
            raise _in_component(name, component.data.name, err) from err
    return MixtureDataset(spec, loaded, batch_size, seed)
