"""What dew's commands print, as a user meets it: one line instead of a traceback where a command
cannot do what it is asked (``-m`` with ``--cfg``, a reader that leaves the pipe early), help that
names what the docs name, and no library noise (orbax's warnings, Optuna's colour codes)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, cli_env, dew
from tests.training.conftest import TINY, fast_env


def plain_env() -> dict[str, str]:
    """The user's environment without a colour preference (a test process may have set one)."""
    return {k: v for k, v in cli_env().items() if k not in ("NO_COLOR", "FORCE_COLOR")}


def one_line_error(result: subprocess.CompletedProcess, prog: str = "dew-train") -> str:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), result.stderr[-3000:]
    return lines[0]


# ------------------------------------------------------------------------------ a closed pipe
@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ["dew.cli.train", "--help"],
        ["dew.cli.train", "--hydra-help"],
        ["dew.cli.plan", "--help"],
        ["dew.cli.runs", "--help"],
        ["dew.cli.sample", "--help"],
        ["dew.cli.runs", "."],
        ["dew.cli.train", "--cfg", "job"],
    ],
    ids=" ".join,
)
def test_a_reader_that_leaves_early_ends_the_command_quietly(tmp_path: Path, command: list[str]):
    """``dew-train --help | head -1``, the reader gone before the command writes: no BrokenPipeError,
    exit 141 (what a shell reports for a command SIGPIPE ended). The read end is closed before the
    interpreter has even started, so every write meets the closed pipe (not only a long one)."""
    (tmp_path / "ck").mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", *command],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()
    stderr = proc.stderr.read()
    proc.wait(timeout=120)
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr and "Exception ignored" not in stderr, stderr
    assert proc.returncode == 141, (proc.returncode, stderr)


# ------------------------------------------------------------------------------ -m with --cfg


@pytest.mark.slow
def test_cfg_under_multirun_prints_the_sweeps_config(workdir: Path):
    hydra = dew("-m", "experiment=digits", "--cfg", "hydra", cwd=workdir)
    assert hydra.returncode == 0 and "Traceback" not in hydra.stderr, hydra.stderr[-3000:]
    assert re.search(r"^  mode: MULTIRUN$", hydra.stdout, re.M)
    assert "_target_: hydra_plugins.dew_launchers.BasicLauncher" in hydra.stdout  # the sweep's launcher

    job = dew("-m", "experiment=digits", "optim.learning_rate=1e-3,3e-3", "--cfg", "job", cwd=workdir)
    assert job.returncode == 0 and "Traceback" not in job.stderr, job.stderr[-3000:]
    assert re.search(r"^  learning_rate: 0\.001$", job.stdout, re.M) and "0.003" not in job.stdout
    assert job.stderr.strip() == "dew-train: the config of the sweep's first job (optim.learning_rate=0.001)"

    sampled = dew("-m", "experiment=digits", "optim.learning_rate=interval(1e-3,3e-3)", "--cfg", "job", cwd=workdir)
    assert sampled.returncode == 2 and sampled.stdout == ""
    assert one_line_error(sampled).startswith(
        "dew-train: error: optim.learning_rate=interval(1e-3,3e-3): the sweeper samples this value"
    )
    assert list(workdir.iterdir()) == []


# ---------------------------------------------------------------------------------------- help


@pytest.mark.slow
def test_hydra_help_names_the_launchers_as_the_docs_do(workdir: Path):
    shown = dew("--hydra-help", cwd=workdir)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "--multirun,-m : Run multiple jobs" in shown.stdout  # Hydra's flags, as Hydra writes them
    groups = dict(re.findall(r"^(hydra/[\w/]+): (.*)$", shown.stdout, re.M))
    assert groups["hydra/launcher"] == "dew_basic (default), local, slurm"
    assert groups["hydra/sweeper"] == "basic (default), optuna"
    docs = "\n".join(
        p.read_text() for p in [REPO / "README.md", REPO / "launch" / "README.md", *REPO.glob("docs/*.md")]
    )
    for name in ("local", "slurm", "optuna"):
        assert re.search(rf"hydra/(launcher|sweeper)=\b{name}\b", docs), name
    # An app's overrides (which Hydra's own help cannot compose) and a profile of launch/ are taken.
    chosen = dew("experiment=digits", "hydra/launcher=local", "--hydra-help", cwd=workdir)
    assert chosen.returncode == 0 and "Traceback" not in chosen.stderr, chosen.stderr[-3000:]


@pytest.mark.slow
def test_the_help_names_files_that_declare_the_fields(workdir: Path):
    shown = dew("--help", cwd=workdir)
    assert shown.returncode == 0, shown.stderr[-3000:]
    named = re.findall(r"\bdew/[\w/]+(?:\.py|/)", shown.stdout)
    assert "dew/contract/config.py" in named
    for path in named:
        assert (REPO / path).exists(), path
    assert "class TrainerConfig" in (REPO / "dew" / "contract" / "config.py").read_text()


# ------------------------------------------------------------------------------------- quiet


@pytest.mark.slow
def test_a_run_its_resume_and_a_warm_start_print_no_orbax_warnings(workdir: Path):
    """A checkpoint where the run does not evaluate (no metric for orbax to rank it by), the same run
    launched again (it restores), and a run warm-started from it (orbax opens it read only): orbax
    warns about each through absl; dew drops exactly those lines. The runs are the suite's TINY on its
    compilation cache, with no samples at the end (the digits preset's batch of 128 with no cache compiled every
    program of each of the three runs: 17 CPU-s standalone, where orbax's notes are all this checks)."""
    tiny = [*TINY, "trainer.checkpoint_dir=ck"]
    run = [*tiny, "trainer.name=a", "trainer.steps=4", "trainer.checkpoint_every=2", "trainer.eval_every=3"]
    outputs = []
    for args in (run, run, [*tiny, "trainer.name=b", "trainer.steps=2", "trainer.init_from=ck/a"]):
        result = dew(*args, cwd=workdir, env=fast_env())
        assert result.returncode == 0, result.stderr[-3000:]
        outputs.append(result.stdout + result.stderr)
    assert "checkpointing every 2" in outputs[0] and "already completed its 4 steps" in outputs[1]
    assert sorted(p.name for p in (workdir / "ck" / "a").iterdir() if p.name.isdigit()) == ["2", "4"]
    for out in outputs:
        for noise in (
            "Given directory is read only",
            "Metadata file does not exist",
            "tracked_metric",
            "read_only=True",
            "[absl]",
        ):
            assert noise not in out, out[-3000:]


def test_only_the_expected_orbax_notes_are_dropped():
    import logging

    from dew.training.checkpointing.checkpoints import OrbaxNotes

    absl = logging.getLogger("absl")
    assert sum(isinstance(f, OrbaxNotes) for f in absl.filters) == 1

    def record(msg: str, level: int = logging.WARNING) -> logging.LogRecord:
        return logging.LogRecord("absl", level, __file__, 1, msg, ("/x",), None)

    notes = OrbaxNotes()
    assert not notes.filter(record("Given directory is read only=%s"))
    assert notes.filter(record("Given directory is read only=%s", logging.ERROR))  # an error always shows
    assert notes.filter(record("Failed to read Metadata file: %s, error: %s"))
    assert notes.filter(record("Metadata file does not exist: %s and more"))


CHATTER = re.compile(r"absl|orbax|optuna|A new study created|Trial \d+ finished|^[IWEF]\d{4} ", re.IGNORECASE)
"""A line from a library's own logging: absl's (orbax logs through it, with its ``I1206 ...`` prefix
when absl formats it), Optuna's (its logger, its per-trial and study-created news)."""
OURS = re.compile(r"^\[[^\]]+\]\[(HYDRA|dew(\.[\w.]+)?)\]|^dew-train: ")
"""A line of dew's own: Hydra's and dew's loggers, or a command's ``dew-train:`` line."""


@pytest.mark.slow  # 3 two-step trials in one process
def test_a_search_prints_no_library_chatter_and_the_same_lines_per_trial(workdir: Path):
    """The shipped search preset (``hparams_search=digits``: TPE, a median pruner) with its trials cut
    to two steps and to 3, its sampler's random startup cut from 10 trials to 2 (two random trials,
    then a TPE draw: both phases of the study, as 10 and 2 of 12 were; trial 0 compiles, so trials 1
    and 2 are the random and the TPE trial whose lines are compared; a fourth trial, a second TPE
    draw, compared nothing new for ~2 CPU-s),
    its output captured through a pipe as a user's ``| tee`` would: every
    line is Hydra's, dew's or the command's own, none is absl's, orbax's or Optuna's (its logger's
    "A new study created" and "Trial n finished" news: dew's study line says it once), no colour
    codes, and each trial prints the same number of lines (its start, its steps and evaluations, its
    end and where it went), so a search's console grows by one trial's lines per trial. (The preset's
    pruner judges from step 600 on, so it judges none of these trials, at 12 trials as at 3.)"""
    result = dew(
        "-m",
        "hparams_search=digits",
        "optim.schedule.warmup_steps=int(interval(0, 1))",  # the preset's 0-300: the trials are 2 steps
        # The suite's TINY (batch 32, its compilation cache, no end samples): the trials load the
        # programs the trainer's tests cache (the preset's batch of 128 compiled its own, and each
        # trial traced the sampler: 15.1 CPU-s standalone before, where the console is all it checks).
        *[o for o in TINY if not o.startswith("optim.schedule")],
        "trainer.checkpoint_dir=ck",
        "trainer.steps=2",
        "trainer.eval_every=2",
        "trainer.checkpoint_every=null",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.sampler.n_startup_trials=2",  # the preset's 10: trial 2 is TPE's
        cwd=workdir,
        env=plain_env(),
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    lines = out.splitlines()
    assert [line for line in lines if CHATTER.search(line)] == [], out[-3000:]
    assert [line for line in lines if not OURS.search(line)] == [], out[-3000:]
    assert "\x1b[" not in out, out[-3000:]
    assert len(re.findall(r"study [\w-]+ in .*: 0 trials so far, 3 asked for", out)) == 1, out[-3000:]
    per_trial = [len(chunk.splitlines()) for chunk in re.split(r".*: starting, 2 steps, in .*\n", result.stderr)[1:]]
    assert len(per_trial) == 3, result.stderr[-3000:]
    # The first trial compiles (and says once which attention it chose); the others load its programs.
    assert len(set(per_trial[1:])) == 1, per_trial
    assert per_trial[0] - per_trial[1] <= 3, per_trial
    launched = [line for line in result.stdout.splitlines() if "Launching" in line]
    assert len(launched) <= 3 and len(result.stdout.splitlines()) <= 2 + len(launched) + 3 * 3, result.stdout


# ------------------------------------------------------------------------------ help without JAX


def test_sample_export_and_plan_answer_help_and_bad_options_without_jax():
    """In a fresh interpreter: importing dew-sample's, dew-export's, dew-eval's and dew-plan's modules, and their
    ``--help`` and argument errors (dew-plan's help is Hydra's), load no JAX library: JAX loads only
    once the arguments are good."""
    code = "\n".join(
        [
            "import contextlib, io, sys",
            "import dew.cli.sample, dew.cli.export, dew.cli.eval, dew.cli.plan",
            "codes = []",
            "for main, argv in [(dew.cli.sample.main, ['--help']), (dew.cli.sample.main, ['run', '--count', '0']),",
            "                   (dew.cli.export.main, ['--help']), (dew.cli.export.main, ['run']),",
            "                   (dew.cli.eval.main, ['--help']), (dew.cli.eval.main, ['run', 'step'])]:",
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):",
            "        try:",
            "            main(argv)",
            "        except SystemExit as exit:",
            "            codes.append(exit.code)",
            "print(codes, sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'flax', 'optax', 'orbax', 'grain')))",  # noqa: E501
        ]
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=cli_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0, 2, 0, 2, 0, 2] []"
