"""A plugin's hook (docs/extending.md) for the tests that stop a multi-process run mid-run and let it
resume (tests/cli/test_stall.py, tests/cli/test_slurm.py): each step of a run started from step 0
takes ``seconds`` longer, so that the test's signal reaches the run before its last step (with every
program in the compilation cache a tiny run trains 30 steps a second), and the steps of a resumed run
take no longer than they do, since nothing signals it.

Not tests/training/conftest.py's ``slow_steps``, which slows every start: a run of several processes
costs CPU for as long as it steps, asleep or not (2 processes of 1 CPU device, 80 steps of 0.1 s:
8.2 CPU-s against 1.2 for the same steps unslowed, measured 2026-12-06), and the resumed starts of
those tests stepped slowly through 80 and 12 steps that only had to end."""

from __future__ import annotations

from pathlib import Path

PLUGIN = """
import time
from dew.training.hooks import Hook, hooks

@hooks.register("slow_first_start")
class SlowFirstStart(Hook):
    def __init__(self, every=1, seconds=1.0):
        super().__init__(every)
        self.seconds, self.fresh = seconds, None

    def before(self, step):
        if self.fresh is None:  # the first step this process dispatches: 0 unless it resumed
            self.fresh = step == 0
        if self.fresh:
            time.sleep(self.seconds)
"""


def slow_first_start(site: Path, seconds: float) -> tuple[str, str]:
    """Install the plugin (a package and its ``dew.plugins`` entry point) under ``site``: (the
    ``PYTHONPATH`` a command needs to find it, this checkout's included; the ``trainer.hooks``
    override that turns it on)."""
    from tests.training.conftest import install_plugin

    pythonpath = install_plugin(site, "slow_first_start", PLUGIN)
    return pythonpath, f"trainer.hooks=[{{name: slow_first_start, every: 1, options: {{seconds: {seconds}}}}}]"
