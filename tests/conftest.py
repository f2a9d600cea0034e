"""Suite-wide settings: CPU JAX, one compilation cache for the session, and a helper that runs the
real CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from dew.launching.gc_settings import collect_less

# The suite's own processes collect garbage as a dew program does (the commands it runs and their
# tasks do it themselves): -9% CPU on the fast tier in one process (109.8, 102.5 -> 100.2, 93.4 CPU-s),
# the same peak memory.
collect_less()

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

# What this process compiles, it compiles unoptimised: the tests' programs are tiny, XLA's backend
# optimisation is most of their compile time (a tiny DiT's forward compiles ~2.4x faster without it),
# and every check compares programs compiled alike or holds at any optimisation level. Set before
# JAX opens a backend; the dew commands the tests run compile alike (``cli_env``: -8% CPU on the
# preset and check tests), but for a test that needs XLA's defaults (``cli_env(unoptimised=False)``).
FAST_XLA_FLAG = "--xla_backend_optimization_level=0"
# (This file is imported twice, as pytest's conftest and as tests.conftest: the second import must
# find the user's flags under the ones the first added.)
USER_XLA_FLAGS = os.environ.get("XLA_FLAGS", "").replace(FAST_XLA_FLAG, "").strip() or None
os.environ["XLA_FLAGS"] = f"{USER_XLA_FLAGS or ''} {FAST_XLA_FLAG}".strip()

REPO = Path(__file__).resolve().parent.parent

# One persistent compilation cache for the whole session, every process of it (pytest-xdist's
# workers inherit the variable from the process that starts them, and so do the CLI subprocesses):
# the suite trains the same tiny programs in hundreds of runs, and each run after the first that
# compiled one loads it (the suite's CPU time: -20% on the trainer, stop, bad-input and preemption
# tests). A program loaded from the cache is the one compiled, so every comparison of runs holds.
# Fresh for each session (CI's case), removed at its end; never the user's own cache (the default
# of trainer.compilation_cache_dir reads DEW_COMPILATION_CACHE). Tests of the cache use their own.
SUITE_CACHE = os.environ.get("DEW_COMPILATION_CACHE") or os.environ.setdefault(
    "DEW_COMPILATION_CACHE", tempfile.mkdtemp(prefix="dew-suite-jax-cache-")
)


# The modules holding the suite's longest tests (20-160 s each: multi-process runs, launches, the
# documented commands, mypy on a fresh clone), longest first, run before the rest. Under
# `--dist worksteal` the first worker starts on them while the second starts halfway down the
# collection, and the workers end on short tests that either can take: in collection order they
# came last (test_slurm_stops, test_stall, test_workers: 76 s together at the end of one worker on
# 2026-12-06, the other idle for 39 s of it). Replaying three fresh-clone runs' measured durations
# through a simulation of work stealing: 943/938/894 s in collection order, 943/923/879 s with these
# modules first. Whole modules, so that a module's fixtures are still made once.
LONGEST_FIRST = (
    "tests/cli/test_interrupts.py",
    "tests/cli/test_docs.py",
    "tests/cli/test_slurm.py",
    "tests/training/test_multiprocess.py",
    "tests/bench/test_refill_bench.py",
    "tests/training/test_sharding_rules.py",
    "tests/cli/test_search.py",
    "tests/objectives/test_sample.py",
    "tests/training/optim/test_mup_coord.py",
    "tests/cli/test_stall.py",
    "tests/cli/test_slurm_stops.py",
    "tests/test_tooling.py",
    "tests/bench/test_gpu_smoke.py",
    "tests/cli/test_workers.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    first = {path: rank for rank, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.nodeid.split("::")[0], len(first)))  # stable: the rest in order


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and Path(SUITE_CACHE).name.startswith("dew-suite-jax-cache-"):
        shutil.rmtree(SUITE_CACHE, ignore_errors=True)  # the process that made it (not an xdist worker)


def cli_env(*, unoptimised: bool = True, **extra: str) -> dict[str, str]:
    """The environment of a dew command a test runs: this one's, without pytest's and Hydra's
    variables, compiling ``unoptimised`` as this process does (XLA_FLAGS gets ``FAST_XLA_FLAG``:
    the runs the suite compiles are tiny, and one compilation cache serves the tests' own programs
    and their commands'); ``unoptimised=False`` gives XLA's defaults (the user's XLA_FLAGS)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "PYTEST_", "XLA_FLAGS"))}
    flags = f"{USER_XLA_FLAGS or ''} {FAST_XLA_FLAG if unoptimised else ''}".strip()
    if flags:
        env["XLA_FLAGS"] = flags
    env.update(JAX_PLATFORMS="cpu", WANDB_MODE="offline", WANDB_SILENT="true", **extra)
    return env


def dew(
    *args: str, cwd: Path, timeout: float = 600, env: dict[str, str] | None = None, script: str = "dew.cli.train"
) -> subprocess.CompletedProcess:
    """Run a dew command (``python -m dew.cli.train ...``) as a user would, in ``cwd``: in its own
    process, forked from a warm interpreter where the command reads nothing at start that a cold one
    would read differently (tests/warm.py)."""
    from tests import warm

    return warm.run(script, list(args), cwd, env or cli_env(), timeout)


def tree(root: Path) -> list[str]:
    """Every path under ``root``, relative and sorted (what a command left on disk)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d
