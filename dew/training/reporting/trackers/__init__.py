"""The trackers a run reports to besides its journal: each one registered class, a ``Sink``.

dew's own are one module each: W&B (``trainer.wandb``), TensorBoard, MLflow and CSV
(``trainer.trackers.<name>``); a plugin package adds one by registering a ``Sink`` subclass in
``dew.contract.trackers.trackers`` (docs/extending.md), which ``trainer.trackers.plugins.<name>``
turns on. The ``Tracker`` (dew.training.reporting.tracker) hands each tracker the run turns on what
the journal gets: the metric records, the samples of each evaluation, the checkpoint the run ends
on, the run's end. Only process 0 opens them, and each imports its library (wandb, tensorboardX,
mlflow) only when it is opened.

A tracker that raises (a server down, a full disk, a network gone) is warned about once and turned
off for the rest of the run (``Guarded``): the run goes on and the journal keeps everything. A
missing library or a tracker that cannot work where the run writes is refused before the run starts
(``check``), like every other bad setting.

Resuming follows the journal's history (``dew.contract.journal``): a tracker that keeps a run of its
own (W&B, MLflow) gives its id (``resume_id``), which every checkpoint keeps and a resume hands back,
so the resumed run continues it; TensorBoard is told that the run restarted at the resumed step;
the CSV is written again from the journal's history and appended to.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from dew.contract.rundir import FAILURES
from dew.contract.trackers import TrackerSpec, trackers

if TYPE_CHECKING:
    from etils import epath

    from dew.contract.config import TrainerConfig

log = logging.getLogger("dew")


@dataclasses.dataclass(frozen=True)
class TrackedRun:
    """The run a tracker is opened for, as the journal sees it."""

    name: str
    """The run's name (``trainer.name``, or the one dew gave it)."""
    directory: epath.Path
    """The run's tracking folder, which holds its journal (local, or any filesystem epath reaches)."""
    config: Mapping[str, Any]
    """What the run reports as its config: ``run`` (the record, as run.json holds it), ``summary``
    (the recipe's own view of the run) and ``total_steps``."""
    run_record: epath.Path | None
    """``run.json`` in the run directory, when there is one."""
    history: Sequence[Mapping[str, Any]]
    """The journal's history before this segment (``read_journal``): the records a resume goes on from."""
    resume_step: int | None
    """The step a resumed run goes on from; None for a run that starts."""
    resume_id: str | None
    """This tracker's own id the checkpoint kept (``Sink.resume_id``), for a resume to continue its run."""


class Sink(TrackerSpec):
    """One tracker: opened for a run (``__init__``), then handed what the journal gets, as that
    tracker takes it. Register a subclass with ``@trackers.register("name")``; its ``Options`` are
    what ``trainer.trackers.plugins.<name>`` holds. Each method may raise: the run warns once and
    turns the tracker off."""

    libraries: ClassVar[tuple[str, ...]] = ()
    """The modules it imports when it is opened; a missing one refuses the run before it starts."""
    install: ClassVar[str] = ""
    """How to install them, for that message (``pip install 'dew[trackers]'``)."""
    takes_samples: ClassVar[bool] = True
    """Whether it takes the samples of each evaluation (``image``, ``texts``)."""

    def __init__(self, options: Any, run: TrackedRun) -> None:
        """Open the tracker for ``run`` with its ``options`` (an ``Options`` record)."""

    @classmethod
    def field(cls) -> str:
        """The config field that turns it on, for messages."""
        from dew.contract.config import Trackers  # not at import: a plugin imports this module while dew loads

        own = {f.name for f in dataclasses.fields(Trackers)} - {"plugins"}
        return f"trainer.trackers.{cls.name}" if cls.name in own else f"trainer.trackers.plugins.{cls.name}"

    @classmethod
    def options(cls, trainer: TrainerConfig) -> Any:
        """Its options in ``trainer``, None when the run leaves it off."""
        return trainer.trackers.get(cls.name)

    @classmethod
    def check(cls, options: Any, tracking: epath.Path) -> None:
        """Refuse, with a ValueError naming the field, options that cannot work for a run whose
        tracking folder is ``tracking`` (its library is checked before)."""

    @classmethod
    def destination(cls, options: Any, name: str, tracking: epath.Path) -> str | None:
        """Where it writes run ``name`` (``tracking``: the run's tracking folder), a phrase for the line
        that says where the run went; None says nothing."""
        return None

    def metrics(self, record: Mapping[str, Any]) -> None:
        """A metric record as the journal writes it: ``step``, ``time`` and the values (a non-finite
        value as its name, ``"nan"``)."""

    def image(self, step: int, path: str) -> None:
        """A sample grid the run wrote at an evaluation."""

    def texts(self, step: int, texts: Sequence[str]) -> None:
        """Text samples drawn at an evaluation."""

    def checkpoint(self, name: str, path: str, step: int) -> None:
        """The checkpoint the run ends on, at ``path`` (a local folder or a URL)."""

    def close(self, ended: str) -> None:
        """The run is over: ``ended`` is ``finished``, ``failed`` or ``stopped`` (``outcome``)."""

    @property
    def resume_id(self) -> str | None:
        """What a resumed run needs to continue this tracker's run (kept in the checkpoint)."""
        return None


OWN = ("wandb", "tensorboard", "mlflow", "csv")
"""dew's own trackers, in the order a run opens them and names where they wrote."""


def sink_classes() -> list[type[Sink]]:
    """Every registered tracker, in the order a run opens them: dew's own (``OWN``), then the
    plugins' in the order they registered."""
    classes = []
    for name in sorted(trackers, key=lambda n: OWN.index(n) if n in OWN else len(OWN)):
        cls = trackers[name]
        if not issubclass(cls, Sink):
            raise TypeError(f"tracker {name!r} ({cls.__module__}.{cls.__qualname__}) does not subclass Sink")
        classes.append(cls)
    return classes


def turned_on(trainer: TrainerConfig) -> list[tuple[type[Sink], Any]]:
    """The trackers ``trainer`` turns on, each with its options."""
    return [(cls, options) for cls in sink_classes() if (options := cls.options(trainer)) is not None]


def check(trainer: TrainerConfig, tracking: epath.Path) -> None:
    """Refuse, before anything is written, a tracker whose library is missing or that cannot write
    where the run's tracking folder is (``tracking``)."""
    for cls, options in turned_on(trainer):
        for library in cls.libraries:
            if importlib.util.find_spec(library) is None:
                how = f": {cls.install}" if cls.install else ""
                raise ValueError(f"{cls.field()} needs the {library} package, which is not installed{how}")
        cls.check(options, tracking)


def destinations(trainer: TrainerConfig, name: str, tracking: epath.Path) -> list[str]:
    """Where each tracker the run turns on writes run ``name`` (``tracking``: the run's tracking
    folder), a phrase each, for the line that says where the run went."""
    places = (cls.destination(options, name, tracking) for cls, options in turned_on(trainer))
    return [place for place in places if place is not None]


def takes_samples(trainer: TrainerConfig) -> bool:
    """Whether a tracker the run turns on takes the samples of each evaluation (W&B, TensorBoard,
    MLflow, a plugin's): decided from the config, so every process agrees (sampling may span all
    of them)."""
    return any(cls.takes_samples for cls, _ in turned_on(trainer))


def outcome(last_event: Mapping[str, Any] | None) -> str:
    """How the run ended, from its last lifecycle event: ``finished`` (``end``), ``failed`` (a stop
    for a failure, or no event: an exception before the loop wrote one) or ``stopped`` (a signal)."""
    if last_event is None:
        return "failed"
    if last_event["event"] == "end":
        return "finished"
    return "failed" if last_event.get("reason") in FAILURES else "stopped"


class Guarded:
    """A tracker whose failure turns it off with one warning instead of ending the run."""

    def __init__(self, cls: type[Sink], resume_id: str | None = None) -> None:
        self.cls = cls
        self.name, self.field = cls.name, cls.field()
        self.sink: Sink | None = None
        self.resume_id = resume_id
        """The tracker's run for a resume to continue: the one it opened, else the one it was given
        (a tracker down for a while is continued once it is back)."""

    def open(self, options: Any, run: TrackedRun) -> None:
        try:
            self.sink = self.cls(options, run)
            self.resume_id = self.sink.resume_id or self.resume_id
        except Exception as err:  # a tracker that cannot open: the run goes on without it
            self.fail(err)

    def call(self, method: str, *args: Any) -> None:
        if self.sink is None:
            return
        try:
            getattr(self.sink, method)(*args)
        except Exception as err:  # any failure of a tracker: the run and its journal go on
            self.fail(err)

    def fail(self, err: BaseException) -> None:
        log.warning(
            "%s failed (%s: %s); it is off for the rest of this run, whose journal keeps every record",
            self.field,
            type(err).__name__,
            err,
        )
        self.sink = None


def open_sinks(trainer: TrainerConfig, run: TrackedRun, resume_ids: Mapping[str, str | None]) -> list[Guarded]:
    """The trackers ``trainer`` turns on, opened for ``run``, each with the id its run had
    (``resume_ids``, by tracker name). A tracker that fails to open is warned about and left off."""
    opened = []
    for cls, options in turned_on(trainer):
        guarded = Guarded(cls, resume_ids.get(cls.name))
        guarded.open(options, dataclasses.replace(run, resume_id=guarded.resume_id))
        opened.append(guarded)
    return opened
