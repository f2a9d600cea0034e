"""The run directory's format: the names and versions its writer and its readers share.

``dew.training`` writes a run (the record, the lock, the checkpoints, the journal beside them);
``dew.runs`` (``dew-runs``) and ``dew-sample`` read it. Both sides take what they must agree on from
here and never from each other, so a reader does not import the trainer's modules (JAX, orbax) and
the trainer does not import a reader. This module imports nothing else from dew and no JAX.
"""

from __future__ import annotations

RUN_RECORD = "run.json"
"""The run's typed config, written by process 0 before anything trains (``RunConfig.save``)."""

LOCK_FILE = ".lock"
"""The file the writing process holds an OS lock on; it names the last holder
(``dew.contract.lock``)."""

BEST_METRIC = "eval/loss"
"""The metric the best checkpoint is kept by, unless a metric marked ``best`` replaces it."""

STEP_FINISHED = "_CHECKPOINT_METADATA"
"""The file orbax writes into a step's directory last, when the save is finalised: a directory named
by a step number that holds it is a checkpoint (a sweep's job directories may be named by their
number alone)."""

DAMAGED = "damaged"
"""The infix of a damaged step's new name, beside the others: ``<step>.damaged-<YYYYmmdd-HHMMSS>``
(``damaged_name``); its number is then free for the run to save again."""


def is_step(name: str) -> bool:
    """Whether a name in a run directory is a step's checkpoint: the step number alone, as orbax
    names it. A save still in flight (``<step>.orbax-checkpoint-tmp``) and a damaged step moved aside
    are not."""
    return name.isdigit()


def damaged_name(step: int, stamp: str, n: int = 1) -> str:
    """The name a damaged ``step`` is moved aside to at ``stamp`` (``%Y%m%d-%H%M%S``); ``n`` > 1 when
    that name is taken already."""
    return f"{step}.{DAMAGED}-{stamp}" + (f"-{n}" if n > 1 else "")


TOKENIZER_DIR = "tokenizer"
"""The folder of a token run's directory that holds the tokenizer its data was encoded with: its
record (``tokens.json``, the sidecar's form) and its files (``tokenizer.json``, and a pretrained
tokenizer's ``tokenizer_config.json``), copied when the run starts, so ``dew-sample`` decodes with the
tokenizer the run trained on even if the one it was read from changes."""

SAMPLE_PREFIX = "samples"
"""How the samples in a run's directory are named: ``samples.png`` or ``samples.txt``, which
``dew-train`` draws at the end of a run (``dew.sampling``), and ``dew-sample``'s
``samples-step<s>-seed<n>.*``; ``dew-runs show`` lists every file so named."""

TRACKING_DIR = "tracking"
"""The directory beside the runs (a sibling of ``trainer.checkpoint_dir``) that holds their journals,
one folder per run name."""

JOURNAL = "journal.jsonl"
"""A run's journal in its tracking folder: JSON lines, appended to, never rewritten
(docs/journal.md)."""

METRICS_CSV = "metrics.csv"
"""The CSV of a run's logged metrics beside its journal, written when ``trainer.trackers.csv`` is
set (docs/tracking.md): a row per metric record of the journal's history."""

JOURNAL_VERSION = 1
"""The journal's format (docs/journal.md), declared by every start and resume event. A reader
accepts the versions it knows and says so when it meets a newer one; a change that old readers
would misread raises it."""

EARLY_STOP = "early_stop"
"""The event of a run that ended before its last step because something asked it to, not a signal
(``trainer.early_stopping``, or a hook's stop request: its ``reason``). The run then ends as a
finished one does, with its last checkpoint and an ``end`` event after this one, and a resume trains
nothing; ``dew-runs`` shows it as stopped early."""

PRUNED = "pruned"
"""The ``reason`` of the ``early_stop`` event of a search's trial that its pruner stopped
(``hydra/sweeper/pruner``: docs/search.md); the study records the trial PRUNED."""

PRUNE_CHECK = "prune_check"
"""The event of a search's trial at each evaluation its pruner judged: the ``value`` reported (the
metric the trial returns), ``pruned`` (the verdict) and the pruner's ``attrs`` for the trial
(successive halving's rungs), which the other trials' pruners and the sweeper read back."""

EXTEND = "extend"
"""The journal's event of a resume that changed the run's length (``dew.training.extension``)."""

LIFECYCLE = ("start", "resume", "stop", "end", "checkpoint_fallback", EARLY_STOP, EXTEND)
"""The journal's lifecycle events: the run's history, kept even when a later resume supersedes
their step (the other records are metrics, evaluations and checkpoints)."""

FAILURES = ("nonfinite", "error")
"""Stop reasons that mean the run failed; the others (preempted, interrupted) stopped it on a signal."""


STUDY_FILE = "study.journal"
"""A search's Optuna study, in its sweep directory: Optuna's journal file storage (one JSON line per
change, appended under a lock file made with ``O_EXCL``, no ``flock``), which several processes on
several nodes may write at once (docs/search.md)."""

LEGACY_STUDY_FILE = "study.db"
"""Where dew kept a study before its own sweeper (optuna 2.10, SQLite): continued by copying it into
``STUDY_FILE`` once, the file itself left as it was (``dew.runs.study_storage``)."""

STUDY_LOCK_DIR = ".study"
"""Where in a sweep's directory the sweeping process holds the run lock for as long as it sweeps:
one writer of the study at a time."""

STUDY_FAIL_REASON = "fail_reason"
"""The user attribute of a failed trial in the study: why it failed, one line (a trial refused before
it trained has no run of its own to say so)."""


def human(n: float) -> str:
    """A byte count as people read it (``1.5 MB``), as the trainer's log and ``dew-runs show`` write
    the sizes of a run's parameters and checkpoints."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
