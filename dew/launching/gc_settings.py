"""The garbage collector's settings of a dew program: a dew command run as a program (its console
script, ``python -m``) and a launched job's task. A Python process that imports dew and calls it
(``RunConfig.train`` from a notebook or a script) keeps its own settings: they are its owner's.

A training process spends much of its start-up allocating: imports (JAX, Flax, orbax, Hydra: over
a million objects that live as long as the process), then JAX's tracing and lowering of the train
step, the evaluation, the initialisation and the sampler, which make and drop millions of small
objects. CPython's defaults (a collection of the youngest generation every 700 net allocations,
every tenth of those one of the middle one, every tenth of those a full one) then spend 6-13% of
the process's CPU time walking objects that are not garbage, most of all the imported modules' in
every full collection. So a dew program, once its command's modules are imported, collects the
youngest generation every ``THRESHOLDS[0]`` net allocations instead of 700, and the older ones
correspondingly less often. Reference counting still frees every object that is not in a cycle at
once; only cyclic garbage waits longer: a young cycle until the next collection of the youngest
generation (every 100,000 net allocations), an old one until a full collection.

Measured on a tiny digits run (20 steps, programs from the compilation cache), fresh processes side
by side: CPU ratio 0.94 (5.41 -> 5.07 CPU-s a process), the same peak memory (bench/gc_settings.py,
docs/performance.md: "The garbage collector of a dew program"). ``gc.freeze()`` on top of it (the
imported objects moved out of every collection's reach) saved a little more, but a frozen object's
finaliser then never runs when the interpreter ends, which changes how a command that fails ends.
"""

from __future__ import annotations

import gc

THRESHOLDS = (100_000, 50, 100)
"""``gc.set_threshold`` of a dew program: net allocations before a collection of generation 0, and
collections of each generation before one of the next (CPython's defaults: 700, 10, 10)."""


def collect_less() -> None:
    """Collect garbage at ``THRESHOLDS``: for a dew program's own process (``dew.commandline.console.console_script``
    run as the program, ``dew.launching.launchers.job_process_setup``)."""
    gc.set_threshold(*THRESHOLDS)
