"""README.md walked as a new user walks it: every dew command of its shell blocks runs as written,
in the page's order, in a fresh directory holding the files the lines name (tests/cli/test_docs.py's
``user_files``), with the user's environment (XLA's default optimisation, an empty compilation
cache and data cache of its own). Each command ends, or writes its first checkpoint, within 5
minutes on two CPU cores: README's examples are sized for the machine they run on.

A training command that writes a checkpoint is stopped there with Ctrl-C (SIGINT to its process
group, as a terminal sends it) unless a later command of the page reads its run (``dew-eval
checkpoints/digits-500``, ``dew-runs $sweep``): that one runs to its end. The other commands (``--help``,
``--cfg``, ``--check``, ``dew-plan``, ``dew-eval``, ``dew-runs`` and the shell variables) run to their
end. Commands that are not dew's (the install, the suite) are not run. The walk prints each
command's wall time (``pytest -s``) and writes them to ``readme_walk.json`` in its directory.

It takes 15 to 31 minutes (2026-12-05 to 12-07), too long for the suite's bar: it runs only where
``DEW_README_WALK=1`` is set (``.ci/run`` runs it after the suite):

    DEW_README_WALK=1 .venv/bin/python -m pytest -q -s -m readme_walk tests/cli/test_readme_walk.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.doc_commands import Command, collect
from tests.cli.test_docs import CHECKED, INFO_FLAGS, _read_later, mode, user_files
from tests.conftest import REPO, cli_env

LIMIT_S = 300.0
"""Each command ends, or writes its first checkpoint, within this many seconds."""
STOP_S = 120.0
"""How long a run stopped with Ctrl-C may take to save and end."""
WHOLE_S = 600.0
"""How long a run a later command reads whole may go on past its first checkpoint."""
STEP_DIR = re.compile(r"\d+")
"""A checkpoint: a run directory's entry named by its step alone (a save in flight is not)."""


@dataclasses.dataclass
class Walked:
    """One command of the walk and what it did."""

    command: Command
    how: str
    """``ran`` (to its end), ``checkpoint`` (stopped with Ctrl-C at its first checkpoint) or ``failed``."""
    wall_s: float
    """Start to end, Ctrl-C and its save included."""
    checkpoint_s: float | None = None
    """Start to its first checkpoint, for a training command that wrote one."""
    problem: str = ""

    def row(self) -> dict[str, object]:
        return {
            "line": self.command.line,
            "command": self.command.text,
            "how": self.how,
            "wall_s": round(self.wall_s, 1),
            "checkpoint_s": None if self.checkpoint_s is None else round(self.checkpoint_s, 1),
            "problem": self.problem,
        }


def _user_env(root: Path, variables: dict[str, str]) -> dict[str, str]:
    """A user's shell: dew's scripts on PATH, XLA's defaults, fresh compilation and data caches."""
    env = cli_env(unoptimised=False, **variables)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["DEW_COMPILATION_CACHE"] = str(root / "jax-cache")
    env["DEW_DATA_DIR"] = str(root / "datasets")
    return env


def _text(command: Command) -> str:
    """The command as typed in the walk's directory: ``.venv/bin/dew-train`` (the Quickstart, in
    the clone) is the ``dew-train`` on PATH."""
    return re.sub(r"^(\S*/)(dew-[a-z]+)", r"\2", command.text)


def _checkpoints(checkpoints: Path) -> set[Path]:
    if not checkpoints.is_dir():
        return set()
    return {p for p in checkpoints.rglob("*") if STEP_DIR.fullmatch(p.name) and p.is_dir()}


def _train(command: Command, whole: bool, cwd: Path, env: dict[str, str]) -> Walked:
    """Run a training command until it ends, or (unless ``whole``) until its first checkpoint, then
    Ctrl-C it. One with neither in ``LIMIT_S`` is killed and fails; a ``whole`` one past its first
    checkpoint has ``WHOLE_S`` to end."""
    before, start = _checkpoints(cwd / "checkpoints"), time.monotonic()
    log = cwd.parent / f"line-{command.line}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            ["bash", "-c", _text(command)], cwd=cwd, env=env, stdout=out, stderr=out, start_new_session=True
        )
        checkpoint_s, deadline = None, LIMIT_S
        while process.poll() is None and time.monotonic() - start < deadline:
            time.sleep(0.5)
            if checkpoint_s is None and _checkpoints(cwd / "checkpoints") - before:
                checkpoint_s = time.monotonic() - start
                if not whole:
                    os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: the run saves and ends
                deadline = checkpoint_s + (WHOLE_S if whole else STOP_S)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            reason = "did not end" if checkpoint_s else f"neither ended nor wrote a checkpoint in {LIMIT_S:.0f} s"
            return Walked(command, "failed", time.monotonic() - start, checkpoint_s, f"{reason}: {_tail(log)}")
    wall = time.monotonic() - start
    if checkpoint_s is not None and not whole:
        return Walked(command, "checkpoint", wall, checkpoint_s)
    if process.returncode:
        return Walked(command, "failed", wall, checkpoint_s, f"exit {process.returncode}: {_tail(log)}")
    return Walked(command, "ran", wall, checkpoint_s)


def _tail(log: Path) -> str:
    return log.read_text()[-2000:].strip()


def _run(command: Command, cwd: Path, env: dict[str, str]) -> Walked:
    start = time.monotonic()
    try:
        result = subprocess.run(
            ["bash", "-c", _text(command)], cwd=cwd, env=env, capture_output=True, text=True, timeout=LIMIT_S
        )
    except subprocess.TimeoutExpired:
        return Walked(command, "failed", time.monotonic() - start, problem=f"ran past {LIMIT_S:.0f} s")
    wall = time.monotonic() - start
    if result.returncode:
        return Walked(command, "failed", wall, problem=f"exit {result.returncode}: {result.stderr.strip()[-2000:]}")
    return Walked(command, "ran", wall)


def walk(commands: list[Command], cwd: Path) -> list[Walked]:
    """Every dew command and shell variable of ``commands``, in order, in ``cwd``."""
    walked, variables = [], {}
    for command in commands:
        env = _user_env(cwd.parent, variables)
        if command.program == "variable":
            name, _, _ = command.text.partition("=")
            assign = dataclasses.replace(command, text=f'{command.text}; printf %s "${name}"')
            result = subprocess.run(["bash", "-c", assign.text], cwd=cwd, env=env, capture_output=True, text=True)
            variables[name] = result.stdout
            problem = "" if result.stdout else f"set nothing ({result.stderr.strip()})"
            walked.append(Walked(command, "failed" if problem else "ran", 0.0, problem=problem))
        elif not command.is_dew:
            continue
        elif command.program in CHECKED and not INFO_FLAGS & set(command.argv()):
            walked.append(_train(command, _read_later(command, commands) is not None, cwd, env))
        else:
            walked.append(_run(command, cwd, env))
        print(_line(walked[-1]), flush=True)
    return walked


def _line(w: Walked) -> str:
    at = f" (first checkpoint at {w.checkpoint_s:.0f} s)" if w.checkpoint_s is not None else ""
    return f"{w.wall_s:7.1f} s  {w.how:<10} README.md:{w.command.line}: {w.command.text}{at}"


@pytest.mark.slow
@pytest.mark.readme_walk
@pytest.mark.skipif(not os.environ.get("DEW_README_WALK"), reason="the README walk: DEW_README_WALK=1 runs it")
def test_every_readme_command_runs_in_minutes(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    user_files(work)
    commands = collect("README.md", (REPO / "README.md").read_text())
    start = time.monotonic()
    walked = walk(commands, work)
    (tmp_path / "readme_walk.json").write_text(json.dumps([w.row() for w in walked], indent=1))
    print(f"README walk: {len(walked)} commands in {time.monotonic() - start:.0f} s ({tmp_path / 'readme_walk.json'})")
    trained = [c for c in commands if c.is_dew and mode(dataclasses.replace(c, skip=None)) == "check"]
    assert len(trained) >= 15, "the walk found fewer training commands than README shows"
    problems = [f"README.md:{w.command.line}: {w.command.text}: {w.problem}" for w in walked if w.problem]
    assert not problems, "\n".join(problems)
