"""The documentation runs: every ``dew-train`` command in a code block of README.md and docs/*.md is
executed by the real CLI (trained for one step of a tiny model, or composed and converted: see
``TRAINED``), and the defaults the docs state are the program's."""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import yaml

from dew.recipe import Recipe
from tests.conftest import REPO, dew, tree
from tests.training.conftest import dew_train, fast_env

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
PLUGIN_DOCS = {"extending.md"}
"""Docs whose commands train a plugin the guide itself defines: tests/test_extending.py builds it and
runs them."""


def documented_commands() -> list[tuple[str, str]]:
    """(file, command) for every ``dew-train ...`` line in a fenced code block, comment dropped."""
    found: dict[str, str] = {}
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        if doc.name in PLUGIN_DOCS:
            continue
        for block in FENCE.findall(doc.read_text()):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():  # a command continued with \ is one line
                match = re.search(r"(?:^|[\s/])(dew-train(?:\s.*)?)$", line)
                if match:
                    command = re.split(r"\s#\s", match.group(1))[0]
                    command = re.split(r"\s(?:&&?|;|\|\|?)(?:\s|$)", command)[0].strip()  # the command, not the shell around it
                    found.setdefault(command, doc.name)
    return sorted((doc, command) for command, doc in found.items())


COMMANDS = documented_commands()

TRAINED = {
    "dew-train experiment=digits model.config='{\"depth\": 2, \"hidden_size\": 64, \"num_heads\": 4}'",
    "dew-train optim/schedule=power optim.schedule.decay_fraction=0.1",
    "dew-train -m experiment=digits optim.learning_rate=1e-3,3e-3",
    "dew-train experiment=digits trainer.quantization='{act_qtype: null}' lora='{rank: 4, targets: [\"blocks/.*\"]}'",
    "dew-train data=token_windows data.path='shards/train_*.bin' data.val_path=shards/val.bin data.seq_len=1024 "
    "data.vocab_size=50257",
}
"""The commands trained for one step (each a different path through the build: a JSON model record,
a schedule, a sweep, both adapters, token files). Every other command runs as ``dew-train --cfg job
--resolve <command>``, and the config it prints is converted as dew-train converts it: the real
parser and the real conversion, without a minute of JAX per command (the experiment=digits runs
are trained by tests/cli/test_pulse.py)."""

# One optimizer step of a tiny model, nothing evaluated or checkpointed mid-run, minimal samples.
RUN_TAIL = ["trainer.steps=1", "trainer.eval_every=null", "trainer.checkpoint_every=null", "trainer.log_every=1",
            "trainer.compilation_cache_dir=null", "flow_matching.samples_per_class=1", "flow_matching.sample_steps=1",
            "masked_diffusion.samples=1", "masked_diffusion.sample_steps=1", "model.dtype=float32"]


def _tail(args: list[str]) -> list[str]:
    """What makes ``args`` a one-step run of a tiny model."""
    tail = list(RUN_TAIL)
    tail.append("trainer.batch_size=2" if "data=token_windows" in args else "trainer.batch_size=8")
    if any(a.startswith("model.config=") for a in args):
        pass  # the whole JSON record, as written
    elif any(a.startswith("experiment=") for a in args):  # an option set model.config: change its keys
        tail += ["model.config.depth=1", "model.config.hidden_size=32", "model.config.num_heads=2"]
    else:
        tail.append("model.config={depth: 1, hidden_size: 32, num_heads: 2}")
    if "experiment=digits" in args or any(a.startswith("optim/schedule=") for a in args):
        tail.append("optim.schedule.warmup_steps=0")
    return tail


def _make_shards(work: Path) -> None:
    """The files docs/data.md's token_windows command names: raw uint16 ids below its vocabulary."""
    rng = np.random.default_rng(0)
    (work / "shards").mkdir()
    for name, n in (("train_000.bin", 3 * 1024 + 1), ("train_001.bin", 3 * 1024 + 1), ("val.bin", 2 * 1024 + 1)):
        rng.integers(0, 50257, n).astype("<u2").tofile(work / "shards" / name)


def test_the_docs_have_commands():
    commands = [c for _, c in COMMANDS]
    assert TRAINED <= set(commands), TRAINED - set(commands)
    assert len(commands) >= 10


@pytest.mark.slow
@pytest.mark.parametrize("doc, command", COMMANDS, ids=[c for _, c in COMMANDS])
def test_a_documented_command_runs(tmp_path, doc, command):
    args = shlex.split(command)[1:]
    work = tmp_path / "work"
    work.mkdir()
    if command in TRAINED:
        if "data=token_windows" in args:
            _make_shards(work)
        result = dew_train(*args, *_tail(args), "trainer.checkpoint_dir=ck", cwd=work, timeout=600, env=fast_env())
        assert result is not None and result.returncode == 0, f"{doc}: {command}\n{result.stdout[-3000:]}"
        assert [p for p in tree(work) if p.endswith("run.json")], f"{doc}: {command} wrote no run"
        return
    if any(a.startswith("--") for a in args):  # --help, --cfg: as written
        result = dew(*args, cwd=work)
        assert result.returncode == 0, f"{doc}: {command}\n{result.stderr[-3000:]}"
        return
    for job in _jobs(args):  # a sweep: each of its jobs (Hydra takes --cfg or -m, not both)
        result = dew("--cfg", "job", "--resolve", *job, cwd=work)
        assert result.returncode == 0, f"{doc}: {command}\n{result.stderr[-3000:]}"
        Recipe.from_dict(yaml.safe_load(result.stdout))  # raises as dew-train would, naming the field
    assert tree(work) == []


def _jobs(args: list[str]) -> list[list[str]]:
    """The overrides of each job a command runs: itself, or for ``-m`` every combination of its swept
    values, as Hydra's basic sweeper expands them. An interval (a search space for
    hydra/sweeper=optuna: docs/search.md, whose commands tests/cli/test_search.py trains) is left out:
    the key keeps its configured value."""
    if "-m" not in args and "--multirun" not in args:
        return [args]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = [a for a in args if a not in ("-m", "--multirun")]
    choices = []
    for arg, parsed in zip(args, OverridesParser.create().parse_overrides(args)):
        if parsed.is_interval_sweep():
            continue
        if parsed.is_sweep_override():
            choices.append([f"{parsed.get_key_element()}={v}" for v in parsed.sweep_string_iterator()])
        else:
            choices.append([arg])
    return [list(job) for job in itertools.product(*choices)]


def test_data_md_states_both_defaults():
    """The command line's default dataset (conf/config.yaml) and the Python dataclass's."""
    from dew.config import RunConfig

    text = (REPO / "docs" / "data.md").read_text()
    cli_default = re.search(r"^\s*- data: (\w+)", (REPO / "conf" / "config.yaml").read_text(), re.MULTILINE).group(1)
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", text, re.MULTILINE)}
    assert "dew-train's default" in rows[cli_default]
    assert "default of the Python dataclass" in rows[RunConfig().data.name]
    assert sum("default" in row for row in rows.values()) == 2
