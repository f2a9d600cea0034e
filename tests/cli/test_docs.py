"""The documentation runs: every shell command of README.md, docs/*.md, launch/README.md and
``dew-train --help`` (collected by tests/cli/doc_commands.py, nothing registered here) runs, page
by page in the page's order, in a directory holding the files the pages say to have (a corpus, a
prepared token directory, token shards: ``user_dir``).

- The cheap ones run in full, as written, through bash (so ``$sweep`` and ``$(ls -d ...)`` expand
  as a user's shell expands them): ``dew-train --help``/``--cfg``, ``dew-plan``, ``dew-runs``,
  ``dew-prepare``, ``dew-sample``, ``dew-export``, ``dew-eval``, and the shell variables later commands read. A
  command shown with its output (a ``$``-prompt block) must print that output's first line.
- A training command (``dew-train`` or ``dew-recipe`` otherwise) runs with ``--check``: everything a launch checks
  before training, nothing written.
- A line that checks what an earlier line of the page checked (the same words, ``--check`` written
  or not: README's sweep), nothing written since, reads that check's result: one process, not two.
- A command a page marks (``<!-- dew-docs: skip ... -->``, ``# not run: ...``) is reported with
  the page's reason and not run; any other command that is not dew's fails the test (it must be
  marked).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.cli.doc_commands import Command, collect, documented, pages
from tests.conftest import REPO, cli_env, tree
from tests.data.shapes import write_parquet, write_shapes
from tests.fixtures.hf import chat_tune
from tests.slurm_standin import install

FULL = {"dew-plan", "dew-runs", "dew-prepare", "dew-sample", "dew-export", "dew-eval", "variable"}
"""Programs run in full; dew-train and dew-recipe run in full only to show something (INFO_FLAGS)."""
CHECKED = {"dew-train": "dew.cli.train", "dew-recipe": "dew.cli.recipe"}
"""The training commands a page's command runs as a check, and their modules."""
INFO_FLAGS = {"--help", "-h", "--cfg", "-c", "--info", "--hydra-help", "--check"}


def documented_commands() -> list[tuple[str, str]]:
    """(page file name, command) for every ``dew-train`` command the docs show (tests/cli/test_search.py
    and test_slurm.py read them)."""
    return sorted(
        {(Path(c.page).name, c.text[c.text.index("dew-train") :]) for c in documented() if c.program == "dew-train"}
    )


# --- the check: everything a launch checks, nothing trained ---------------------------------------


def _check(args: list[str], cwd: Path, env: dict[str, str], program: str = "dew-train") -> tuple[int, str]:
    """``dew-train --check <args>`` (or ``dew-recipe``'s), as a user runs it: (exit status, stderr).
    Everything a launch checks before training (for a study: its first trials), nothing written."""
    from tests.conftest import dew

    result = dew("--check", *args, cwd=cwd, env=env, script=CHECKED[program])
    return result.returncode, result.stderr


# --- the user's directory: the files the pages say to have -----------------------------------------


@pytest.fixture(scope="module")
def user_template(tmp_path_factory) -> Path:
    """The files the pages say to have (``user_files``), made once for the module's pages."""
    return user_files(tmp_path_factory.mktemp("user"))


def user_files(root: Path) -> Path:
    """Fill ``root`` with the files the pages say to have: a corpus (``corpus/*.txt``,
    ``held_out.txt``), the token directory dew-prepare makes of it (``data/tiny``), one token file
    with its vocabulary (``data/corpus.bin``: launch/README.md), raw token shards (``shards/``:
    docs/data.md, docs/weights.md), a Hugging Face dataset as JSONL, Parquet and a save_to_disk
    directory (``web/``), a model directory's tokenizer (``model/``: docs/data.md), images
    (``photos/``, ``hf/*.parquet``: docs/data.md), and the Llama fixture with a chat template and a
    chat file (``llama/``, ``chats.jsonl``: docs/weights.md)."""
    import datasets
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from dew.data.prepare import prepare

    (root / "corpus").mkdir()
    for i in range(2):
        (root / "corpus" / f"{i}.txt").write_text(f"The quick brown fox {i} jumps over the lazy dog.\n" * 400)
    (root / "held_out.txt").write_text("The lazy dog sleeps.\n" * 200)
    prepare([str(root / "corpus" / "0.txt"), str(root / "corpus" / "1.txt")], str(root / "data" / "tiny"))
    rng = np.random.default_rng(0)
    rng.integers(0, 256, 200_000).astype("<u2").tofile(root / "data" / "corpus.bin")
    (root / "data" / "tokens.json").write_text('{"format": "dew-tokens", "version": 1, "vocab_size": 256}')
    (root / "web").mkdir()
    rows = [{"text": f"Record {i}: the quick brown fox jumps over the lazy dog. " * 8} for i in range(60)]
    (root / "web" / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    datasets.Dataset.from_list(rows).to_parquet(str(root / "web" / "part-0.parquet"))
    splits = {"train": datasets.Dataset.from_list(rows[:50]), "test": datasets.Dataset.from_list(rows[50:])}
    datasets.DatasetDict(splits).save_to_disk(str(root / "web" / "saved"))
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([r["text"] for r in rows], trainers.WordLevelTrainer(special_tokens=["<unk>", "</s>"]))
    (root / "model").mkdir()
    tok.save(str(root / "model" / "tokenizer.json"))
    (root / "model" / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    (root / "shards").mkdir()
    for name, n in (("train_000.bin", 3 * 1024 + 1), ("train_001.bin", 3 * 1024 + 1), ("val.bin", 2 * 1024 + 1)):
        rng.integers(0, 50257, n).astype("<u2").tofile(root / "shards" / name)
    # A Llama directory with a chat template and conversations (docs/weights.md's chat fine-tune).
    chat_tune.llama_with_template(root / "llama")
    chat_tune.write_chats(root / "chats.jsonl")
    # Images (docs/data.md): a class-folder tree in Hugging Face's split layout, and Parquet files.
    write_shapes(root / "photos", 4, split="train")
    write_shapes(root / "photos", 1, split="validation", seed=1)
    write_parquet(root / "hf" / "train.parquet", 4)
    write_parquet(root / "hf" / "val.parquet", 1, seed=1)
    return root


def _user_dir(template: Path, tmp_path: Path) -> Path:
    work = tmp_path / "work"
    shutil.copytree(template, work)
    return work


# --- running a page --------------------------------------------------------------------------------


def _bash(command: Command, variables: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``command`` as a user's shell runs it, the page's earlier variables set, dew's scripts on PATH."""
    env = cli_env(**variables)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-c", command.text], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _words(command: Command, variables: dict[str, str], cwd: Path, globs: bool = False) -> list[str]:
    """The command's words after the shell's expansions (``$sweep``, ``$(...)``; globs left to dew
    unless ``globs``: then bash expands them, as a user's shell does before it runs the command)."""
    result = subprocess.run(
        ["bash", "-c", f"{'' if globs else 'set -f; '}printf '%s\\0' {command.text}"],
        cwd=cwd,
        env=cli_env(**variables),
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.split("\0")[:-1]


def mode(command: Command) -> str:
    """``skip``, ``full`` or ``check``; ``unmarked`` for a command that is not dew's and not marked."""
    if command.skip:
        return "skip"
    if command.program in FULL or command.program == "python -m dew":
        return "full"
    if command.program in CHECKED:
        return "full" if INFO_FLAGS & set(command.argv()) else "check"
    return "unmarked"


def run_page(commands: list[Command], cwd: Path) -> list[str]:
    """Run a page's commands in order in ``cwd``: the problems, one line each (empty: all ran)."""
    problems, variables = [], {}
    checked: dict[tuple[str, ...], tuple[int, str]] = {}
    """The page's checks by their words (``_check_key``) since the last command that may write: a
    line that checks them again (README's sweep, then the same line with ``--check``) reads the
    result instead of a second process (~1 CPU-s each)."""
    for command in commands:
        how = mode(command)
        words = _words(command, variables, cwd) if how == "check" or (how == "full" and _only_checks(command)) else []
        key = _check_key(command, words) if words else None
        if how not in ("skip", "unmarked", "check") and command.program not in CHECKED:
            checked.clear()  # a command that may write: a check after it is run again
        if how == "skip":
            print(f"not run: {command} ({command.skip})")
        elif how == "unmarked":
            problems.append(
                f"{command}: not a dew command, and the page gives no reason not to run it "
                f"(<!-- dew-docs: skip REASON --> before the fence, or # not run: REASON)"
            )
        elif command.program == "variable":
            name, _, _ = command.text.partition("=")
            result = _bash(Command(command.page, command.line, f'{command.text}; printf %s "${name}"'), variables, cwd)
            variables[name] = result.stdout
            if result.returncode or not result.stdout:
                problems.append(f"{command}: set nothing ({result.stderr.strip()})")
        elif key in checked:  # the same check as an earlier line's, nothing written since
            status, stderr = checked[key]
            problems += [f"{command}: exit {status}: {stderr.strip()}"] if status else []
        elif how == "full":
            problems += _full(command, variables, cwd)
        else:
            args = words[words.index(command.program) + 1 :]
            # A SLURM launch is checked where sbatch exists (the stand-in's: a check submits nothing).
            env = install(cwd.parent / "slurm").env(cli_env(**command.env()))
            status, stderr = checked[key] = _check(args, cwd, env, command.program)
            if status:
                problems.append(f"{command}: exit {status}: {stderr.strip()}")
            elif read := _read_later(command, commands):
                checked.clear()
                problems += _train_small(command, args, *read, cwd)
    return problems


def _only_checks(command: Command) -> bool:
    """A ``dew-train --check ...`` line (or dew-recipe's) that shows no output and uses no shell
    syntax: it runs what the check of its words without ``--check`` runs."""
    flags = INFO_FLAGS & set(command.argv())
    return command.program in CHECKED and flags == {"--check"} and not command.output and not SHELL.search(command.text)


def _check_key(command: Command, words: list[str]) -> tuple[str, ...]:
    """What a check of ``command`` runs: its environment and its words after the shell's expansions
    (``words``), ``--check`` aside."""
    env = [f"{k}={v}" for k, v in sorted(command.env().items())]
    words = [w for w in words if w != "--check"]
    return (*env, *words[words.index(command.program) :])


# --- runs a later command reads: trained small ------------------------------------------------------


def _run_path(args: list[str]) -> str | None:
    """Where the command's run goes, as later commands name it: ``checkpoints/<trainer.name>`` (the
    command's, or its experiment preset's), ``checkpoints/<name>-sweep-`` for a multirun."""
    import yaml

    named = {k: v for k, _, v in (a.partition("=") for a in args)}
    name = named.get("trainer.name")
    preset = REPO / "conf" / "experiment" / f"{named.get('experiment', '')}.yaml"
    if name is None and preset.is_file():
        name = (yaml.safe_load(preset.read_text()).get("trainer") or {}).get("name")
    if not name:
        return None
    return f"checkpoints/{name}-sweep-" if {"-m", "--multirun"} & set(args) else f"checkpoints/{name}"


def _read_later(command: Command, commands: list[Command]) -> tuple[int | None, bool] | None:
    """None when no later command of the page reads the run ``command`` trains (of several commands
    training one run, the one nearest before the reader makes it); else the largest of its steps one
    names (None: none is named), and whether one starts a run from it (``trainer.init_from``: its
    shapes must be kept)."""
    run = _run_path(command.argv())
    if not run:
        return None
    path = re.compile(rf"{re.escape(run)}{'' if run.endswith('-') else r'(?=/|\s|$)'}(/\d+)?")
    reads, starts = [], False
    for other in commands[commands.index(command) + 1 :]:
        if mode(other) == "check" and _run_path(other.argv()) == run and not reads:
            return None  # a later command trains that run again: it is the one read
        if mode(other) != "skip":
            found = [m.group(1) or "" for m in path.finditer(other.text)]
            reads, starts = reads + found, starts or bool(found and other.program == "dew-train")
    return (max((int(r[1:]) for r in reads if r), default=None), starts) if reads else None


def _train_small(command: Command, args: list[str], step_named: int | None, shapes_kept: bool, cwd: Path) -> list[str]:
    """Train the run a later command reads, small: no samples at the end (no later command reads
    them; dew-sample draws its own), a tiny model unless a later run starts from it, and two steps
    unless a later command names one of its steps: then up to that step (the last step always
    saves a checkpoint), not the command's length."""
    from tests.conftest import dew
    from tests.training.conftest import TINY, fast_env

    tail = [  # the compilation cache stays the suite's (cli_env's DEW_COMPILATION_CACHE): pages train alike
        "flow_matching.samples_per_class=1",
        "flow_matching.sample_steps=1",
        "trainer.final_samples=false",
    ]
    tiny = not shapes_kept and not any(a.startswith("model.config=") for a in args)
    digits = "experiment=digits" in args and not any(a.startswith("data=") for a in args)
    if tiny and digits:  # TINY's model and batch: the programs the trainer's tests compiled, loaded
        tail += [o for o in TINY if o.startswith(("model.config.", "trainer.batch_size="))]
    else:  # a batch that other data fill (docs/data.md's photos: 12 images)
        tail += ["trainer.batch_size=8"]
        if tiny:
            tail += ["model.config.depth=1", "model.config.hidden_size=32", "model.config.num_heads=2"]
    if step_named is None:
        tail += [
            "trainer.steps=2",
            "trainer.log_every=1",
            "trainer.eval_every=2",
            "trainer.checkpoint_every=null",
            "optim.schedule.warmup_steps=0",
        ]
    else:  # docs/weights.md's base: 100 steps of the 200 it trains, the step its later commands name
        tail += [f"trainer.steps={step_named}"]
    result = dew(*args, *tail, cwd=cwd, env=fast_env(**command.env()), timeout=600)
    if result.returncode:
        return [
            f"{command}: trained small (for the commands after it), exit {result.returncode}: "
            f"{result.stderr.strip()[-2000:]}"
        ]
    return []


MODULES = {
    "dew-train": "dew.cli.train",
    "dew-recipe": "dew.cli.recipe",
    "dew-runs": "dew.cli.runs",
    "dew-plan": "dew.cli.plan",
    "dew-sample": "dew.cli.sample",
    "dew-export": "dew.cli.export",
    "dew-eval": "dew.cli.eval",
    "dew-prepare": "dew.data.prepare",
}
"""The console scripts and the modules they run (pyproject.toml's [project.scripts])."""
SHELL = re.compile(r"[|&;<>`]|\$\(")
"""What only a shell runs: pipes, lists, redirections, command substitutions."""


def _run(command: Command, variables: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """``command`` as a user's shell runs it: a plain command of one of dew's programs (no shell
    syntax but its words' expansions, no assignments before it) runs its module, from the warm
    interpreter where it can (tests/warm.py), on the words bash expanded; anything else runs in bash."""
    from tests import warm

    if command.program in MODULES and not SHELL.search(command.text) and not command.env():
        words = _words(command, variables, cwd, globs=True)
        if words and words[0] == command.program:
            env = cli_env(**variables)
            env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
            return warm.run(MODULES[command.program], words[1:], cwd, env, timeout=300)
    return _bash(command, variables, cwd)


def _full(command: Command, variables: dict[str, str], cwd: Path) -> list[str]:
    result = _run(command, variables, cwd)
    shown = (command.output or [""])[0].strip()
    if command.output:  # the page shows what it prints: an error, in the docs' case
        if shown not in result.stdout + result.stderr:
            return [f"{command}: does not print the page's {shown!r}: {(result.stdout + result.stderr)[-2000:]}"]
        return []
    if result.returncode:
        return [f"{command}: exit {result.returncode}: {(result.stderr or result.stdout).strip()[-2000:]}"]
    return []


PAGES = [*pages(), "dew-train --help"]


def _commands(page: str) -> list[Command]:
    if page == "dew-train --help":
        return [c for c in documented() if c.page == page]
    return collect(page, (REPO / page).read_text())


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_every_command_of_a_page_runs(page, user_template, tmp_path):
    work = _user_dir(user_template, tmp_path)
    before = tree(work)
    commands = _commands(page)
    problems = run_page(commands, work)
    counts = {how: sum(mode(c) == how for c in commands) for how in ("full", "check", "skip")}
    print(f"{page}: {len(commands)} commands: {counts}")
    assert not problems, "\n".join(problems)
    writers = [
        c
        for c in commands
        if (mode(c) == "full" and c.program not in (*CHECKED, "variable"))
        or (mode(c) == "check" and _read_later(c, commands))
    ]
    if not writers:
        assert tree(work) == before  # a check writes nothing


def test_the_collector_finds_every_kind_of_command():
    text = (
        "Text.\n\n```bash\n$ dew-train --help\nusage: ...\n$ dew-runs \\\n  ck\n```\n\n"
        "<!-- dew-docs: skip needs a GPU -->\n```\npython bench/gpu.py\n```\n\n"
        "```\nsweep=$(ls -d ck/*)   # the sweep\nJAX_PLATFORMS=cpu dew-plan model=dit_xl2 # not run: slow\n"
        "ck/run/  a tree line, not a command\n```\n\n```python\ndew-train x=1\n```\n"
    )
    found = collect("page.md", text)
    assert [(c.line, c.text, c.program, c.skip, c.output) for c in found] == [
        (4, "dew-train --help", "dew-train", None, ["usage: ..."]),
        (6, "dew-runs ck", "dew-runs", None, []),
        (12, "python bench/gpu.py", "python", "needs a GPU", []),
        (16, "sweep=$(ls -d ck/*)", "variable", None, []),
        (17, "JAX_PLATFORMS=cpu dew-plan model=dit_xl2", "dew-plan", "slow", []),
    ]
    assert found[-1].env() == {"JAX_PLATFORMS": "cpu"} and found[-1].argv() == ["dew-plan", "model=dit_xl2"]


@pytest.mark.slow
def test_a_typo_in_a_documented_field_fails(tmp_path):
    """A command added to a page with a misspelt field fails the page, naming the field."""
    [command] = collect("new.md", "```\ndew-train experiment=digits trainer.stepz=10\n```\n")
    problems = run_page([command], tmp_path)
    assert len(problems) == 1 and "trainer.stepz" in problems[0] and "exit 2" in problems[0], problems
    assert tree(tmp_path) == []


def test_the_docs_have_commands():
    commands = documented()
    assert len({c.page for c in commands}) >= 10 and sum(mode(c) == "check" for c in commands) >= 20


def test_data_md_states_both_defaults():
    """The command line's default dataset (conf/config.yaml) and the Python dataclass's."""
    from dew.config import RunConfig

    text = (REPO / "docs" / "data.md").read_text()
    cli_default = re.search(r"^\s*- data: (\w+)", (REPO / "conf" / "config.yaml").read_text(), re.MULTILINE).group(1)
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", text, re.MULTILINE)}
    assert "dew-train's default" in rows[cli_default]
    assert "default of the Python dataclass" in rows[RunConfig().data.name]
    assert sum("default" in row for row in rows.values()) == 2
