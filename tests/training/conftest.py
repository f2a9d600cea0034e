"""Helpers for the trainer's tests: a tiny digits run, composed as dew-train composes it, trained in
this process or in a real ``dew-train`` subprocess that a test may SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tests.conftest import FAST_XLA_FLAG, SUITE_CACHE, cli_env


def fast_env(**extra: str) -> dict[str, str]:
    """cli_env for a dew-train subprocess, compiling as this process does (unoptimised: the flag in
    its XLA_FLAGS, after any ``XLA_FLAGS`` given here). The tests' processes set no
    ``assembly.COMPILER_OPTIONS``: a program compiled with options that name the same level is another
    entry of the compilation cache, and a test's own run and a command's would each compile it."""
    return cli_env(XLA_FLAGS=f"{extra.pop('XLA_FLAGS', '')} {FAST_XLA_FLAG}".strip(), **extra)


# A depth-1, width-32 DiT on 8x8 digits: a step takes a few milliseconds on a CPU.
TINY = [
    "experiment=digits",
    "model.config.depth=1",
    "model.config.hidden_size=32",
    "model.config.num_heads=2",
    "trainer.batch_size=32",
    "trainer.log_every=1",
    "optim.schedule.warmup_steps=1",
    "flow_matching.samples_per_class=1",
    "flow_matching.sample_steps=1",
    # No samples at the end: tracing the sampler is ~10% of a tiny run's CPU time (the tests that
    # look at them set trainer.final_samples=true).
    "trainer.final_samples=false",
    f"trainer.compilation_cache_dir={SUITE_CACHE}",
]


def compose(*overrides: str) -> Any:
    """The typed Recipe ``dew-train TINY overrides`` would train."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from dew.commandline.configs import conf_dir, register_configs
    from dew.recipe import Recipe

    GlobalHydra.instance().clear()
    register_configs()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=[*TINY, *overrides])
    return Recipe.from_dict(OmegaConf.to_container(cfg, resolve=True))


def train_tiny(
    tmp: Path,
    *overrides: str,
    name: str = "run",
    objective: Callable[[Any], Any] | None = None,
    data: Callable[[Any], Any] | None = None,
) -> tuple[Any, Path, list[dict]]:
    """Train a tiny run in this process: (final state, run directory, journal). ``objective`` and
    ``data`` wrap the built objective and dataset."""
    from dew.build import build_run

    recipe = compose(f"trainer.checkpoint_dir={tmp / 'ck'}", *overrides)
    recipe, built_objective, dataset = build_run(recipe)
    state = recipe.train(
        objective(built_objective) if objective else built_objective, data(dataset) if data else dataset, name=name
    )
    return state, tmp / "ck" / name, journal(tmp, name)


def journal(tmp: Path, name: str = "run") -> list[dict]:
    from dew.contract.journal import read_journal

    return read_journal(tmp / "tracking" / name / "journal.jsonl")


def losses(journal: list[dict], key: str = "train/loss") -> dict[int, float]:
    return {r["step"]: r[key] for r in journal if key in r}


def load_params(run: Path, step: int) -> dict[str, np.ndarray]:
    """The parameters of a saved step, read back with orbax, flattened by path."""
    import jax
    import orbax.checkpoint as ocp

    restored = ocp.StandardCheckpointer().restore(run / str(step) / "state")
    flat = jax.tree_util.tree_flatten_with_path(restored["params"])[0]
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in flat}


def steps_on_disk(run: Path) -> list[int]:
    return sorted(int(p.name) for p in run.iterdir() if p.name.isdigit())


def dew_train(
    *args: str,
    cwd: Path,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    kill_when: Callable[[Path], bool] | None = None,
    poll: float = 0.002,
) -> subprocess.CompletedProcess | None:
    """Run dew-train in ``cwd``, its output appended to ``dew-train.out`` there, forked from the
    suite's warm interpreter where a cold start would read nothing else (tests/warm.py). With
    ``kill_when``, SIGKILL it as soon as ``kill_when(cwd)`` holds (checked every ``poll``
    seconds) and return None; a run that ends first returns its result. A run past ``timeout`` is
    SIGKILLed (JAX catches SIGTERM) and fails the test."""
    from tests import warm

    if kill_when is None:  # from the suite's warm interpreter where a cold start reads nothing else
        done = warm.run("dew.cli.train", list(args), cwd, env or fast_env(), timeout, log=cwd / "dew-train.out")
        if done is not None:
            return done
    log = open(cwd / "dew-train.out", "a+")
    log.seek(0, os.SEEK_END)
    start = log.tell()
    # killed by its pid: started warm too where it can be (``warm.start``), cold where it cannot
    proc = warm.start("dew.cli.train", list(args), cwd, env or fast_env(), cwd / "dew-train.out") or subprocess.Popen(
        [sys.executable, "-m", "dew.cli.train", *args],
        cwd=cwd,
        env=env or fast_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"dew-train {' '.join(args)} ran past {timeout}s")
            if kill_when is not None and kill_when(cwd):
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return None
            time.sleep(poll)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        log.seek(start)
        out = log.read()
        log.close()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, out)


# A hook a user could write (a plugin's: docs/extending.md) that makes each step slow, taking
# ``seconds`` before the step is dispatched, and (with ``path``) writes down when each step has ended.
# The tests that signal a run mid-run use it: with every program in the compilation cache a tiny run
# trains 30 steps a second, and would end before the signal the test sends at a step.
SLOW_STEPS_PLUGIN = """
import time
from dew.training.hooks import Hook, hooks

@hooks.register("slow_steps")
class SlowSteps(Hook):
    def __init__(self, every=1, seconds=1.0, path=""):
        super().__init__(every)
        self.seconds, self.path = seconds, path

    def before(self, step):
        time.sleep(self.seconds)

    def on_step(self, at):
        if self.path:
            with open(self.path, "a") as f:
                f.write(f"{at.step} {time.time()}\\n")
"""


def install_plugin(site: Path, name: str, source: str) -> str:
    """Install a one-module plugin ``name`` (``source``, with its ``dew.plugins`` entry point) under
    ``site`` once; the ``PYTHONPATH`` a command needs to find it, this checkout's included."""
    from tests.conftest import REPO

    if not (site / name).is_dir():
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text(source)
        info = site / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[dew.plugins]\n{name} = {name}\n")
    return os.pathsep.join(p for p in [str(site), str(REPO), os.environ.get("PYTHONPATH", "")] if p)


def slow_steps(site: Path, seconds: float, path: str = "") -> tuple[str, str]:
    """Install the slow_steps plugin under ``site``: (the ``PYTHONPATH`` a command needs to find it,
    this checkout's included; the ``trainer.hooks`` override that turns it on)."""
    pythonpath = install_plugin(site, "slow_steps", SLOW_STEPS_PLUGIN)
    path_option = f", path: '{path}'" if path else ""
    return pythonpath, f"trainer.hooks=[{{name: slow_steps, every: 1, options: {{seconds: {seconds}{path_option}}}}}]"
