"""Every shipped preset runs as shipped: each file of conf/experiment and conf/hparams_search is
trained by a test here, without overriding what the preset sets, except what makes it affordable,
each for a stated reason (``SHRUNK``): the model, through the ``model.config.*`` sizes; the run's
length, to one step past the preset's largest warmup (a run shorter than its warmup is refused, or
fails its trial: docs/search.md); a token run's windows; a search's trial count. Every
other override sets a field the preset leaves alone (a test checks that), and the compilation cache
is shared through ``DEW_COMPILATION_CACHE``, not an override."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from dew.runs.study_storage import journal
from tests.conftest import REPO
from tests.training.conftest import dew_train, fast_env

CONF = REPO / "conf"
MODEL = ["model.config.depth=1", "model.config.hidden_size=32", "model.config.num_heads=2"]
SHRUNK = {
    "model.config.depth",
    "model.config.hidden_size",
    "model.config.num_heads",
    "trainer.steps",
    "data.seq_len",
    "hydra.sweeper.n_trials",
}
"""The keys a preset sets that these tests override, each to shrink the run: a width-32, one-block
model instead of the preset's; the shortest run its warmup allows; 16-token windows instead of 64
(the token presets: their windows are a size of the run as the model's are, and a step of 64 x 64
tokens cost 2.3x what 64 x 16 does: tiny_lm's 231 steps 21.4 -> 9.0-10.4 CPU-s, tiny_mdlm's 101
15.2 -> 9.5, 2026-12-07; docs/mup.md's tiny_lm commands check the shipped windows and batch in
tests/cli/test_docs.py, and bench/tiny_lm_bzip2.py trains them); a few trials instead of 20."""
SAMPLES = ["flow_matching.samples_per_class=1", "flow_matching.sample_steps=1"]
"""The end-of-run sample grid of an image run, at its smallest (no preset sets it)."""
TOKENS = "data.path=data/tiny/train.bin"

WINDOWS = "data.seq_len=16"
"""The token presets' windows, shrunk (``SHRUNK``)."""
EXPERIMENTS = {"digits": [*SAMPLES], "tiny_lm": [TOKENS, WINDOWS], "tiny_mdlm": [TOKENS, WINDOWS]}
"""Each experiment preset and the overrides it needs besides the model and the length: a token file
for the token runs (the path the preset's own comment names)."""
SEARCHES = {
    "digits": (["experiment=digits", *SAMPLES, "trainer.batch_size=32"], 2),
    "tiny_lm": (["experiment=tiny_lm", TOKENS, "trainer.batch_size=4", "data.seq_len=16"], 1),
}
"""Each search preset: the experiment its comment pairs it with (plus what that needs; the batch,
which the search preset does not set, shrunk: digits' 128 to the suite's 32, so its trials load the
train step the other digits tests compiled (``TINY``'s); tiny_lm's batch and windows, as one tiny_lm
step of the shipped size costs ~90 ms here and the preset's warmups reach 500 steps), and the trials
run."""


def preset(group: str, name: str) -> dict:
    return yaml.safe_load((CONF / group / f"{name}.yaml").read_text())


def flat(node: dict, prefix: str = "") -> set[str]:
    """The dotted keys a preset sets (its defaults list aside)."""
    keys = set()
    for k, v in node.items():
        if k == "defaults":
            continue
        keys |= flat(v, f"{prefix}{k}.") if isinstance(v, dict) and k != "params" else {f"{prefix}{k}"}
    return keys


def largest_warmup(group: str, name: str) -> int:
    """The largest warmup the preset can give a run: its own value, or its search space's top."""
    from dew.launching.search.search_space import parse

    node = preset(group, name)
    if group == "experiment":
        return node["optim"]["schedule"]["warmup_steps"]
    expression = node["hydra"]["sweeper"]["params"]["optim.schedule.warmup_steps"]
    space, _ = parse([f"w={expression}"])
    return space["w"].high


def experiment_command(name: str) -> list[str]:
    return [
        f"experiment={name}",
        *MODEL,
        f"trainer.steps={largest_warmup('experiment', name) + 1}",
        *EXPERIMENTS[name],
        "trainer.checkpoint_dir=ck",
    ]


def search_command(name: str) -> list[str]:
    extra, trials = SEARCHES[name]
    return [
        "-m",
        f"hparams_search={name}",
        *extra,
        *MODEL,
        f"hydra.sweeper.n_trials={trials}",
        f"trainer.steps={largest_warmup('hparams_search', name) + 1}",
        "trainer.checkpoint_dir=ck",
    ]


def test_every_preset_is_run_here():
    assert set(EXPERIMENTS) == {p.stem for p in (CONF / "experiment").glob("*.yaml")}
    assert set(SEARCHES) == {p.stem for p in (CONF / "hparams_search").glob("*.yaml")}


@pytest.mark.parametrize(
    "group,name,command",
    [
        *(("experiment", n, experiment_command(n)) for n in EXPERIMENTS),
        *(("hparams_search", n, search_command(n)) for n in SEARCHES),
    ],
)
def test_a_preset_is_overridden_only_where_it_is_shrunk(group, name, command):
    keys = {
        a.split("=", 1)[0].lstrip("+")
        for a in command
        if "=" in a and not a.startswith(("experiment=", "hparams_search="))
    }
    overridden = keys & flat(preset(group, name))
    assert overridden <= SHRUNK, overridden - SHRUNK
    if group == "hparams_search":  # the experiment it pairs with, shrunk only in its sizes
        experiment = preset("experiment", name)
        assert keys & flat(experiment) <= SHRUNK | {"trainer.batch_size", "data.seq_len"}
        assert largest_warmup("hparams_search", name) >= experiment["optim"]["schedule"]["warmup_steps"]


@pytest.fixture(scope="module")
def presets_dir(tmp_path_factory) -> Path:
    """A working directory holding the token file the token presets read (dew-prepare's output), and
    the compilation cache the module's runs share."""
    from dew.data.prepare import prepare

    work = tmp_path_factory.mktemp("presets")
    corpus = work / "corpus.txt"
    corpus.write_text("".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(1000)))  # 64 KB
    prepare([str(corpus)], str(work / "data" / "tiny"))
    return work


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_an_experiment_preset_trains_as_shipped(name, presets_dir):
    import json

    from dew.contract.journal import read_journal

    work = presets_dir
    result = dew_train(*experiment_command(name), cwd=work, env=fast_env(), timeout=600)
    assert result is not None and result.returncode == 0, result.stdout[-3000:]
    shipped = preset("experiment", name)
    record = json.loads((work / "ck" / name / "run.json").read_text())
    for key in ("learning_rate", "weight_decay", "clip_grads"):
        assert record["optim"][key] == shipped["optim"][key]
    assert record["optim"]["schedule"]["warmup_steps"] == shipped["optim"]["schedule"]["warmup_steps"]
    assert record["trainer"]["batch_size"] == shipped["trainer"]["batch_size"]
    journal = read_journal(work / "tracking" / name / "journal.jsonl")
    steps = largest_warmup("experiment", name) + 1
    assert [r["step"] for r in journal if r.get("event") == "end"] == [steps]
    assert any("eval/loss" in r for r in journal)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SEARCHES))
def test_a_search_preset_completes_its_trials_with_int_warmups(name, presets_dir, tmp_path):
    from PIL import Image

    from dew.cli.runs import run

    work = presets_dir
    result = dew_train(*search_command(name), cwd=work, env=fast_env(), timeout=900)
    assert result is not None and result.returncode == 0, result.stdout[-3000:]
    [sweep] = list((work / "ck").glob(f"{name}-sweep-*"))  # each search preset is its experiment's
    storage = journal(str(sweep / "study.journal"))
    [summary] = optuna.get_all_study_summaries(storage)
    trials = optuna.load_study(study_name=summary.study_name, storage=storage).trials
    top = largest_warmup("hparams_search", name)
    assert [t.state.name for t in trials] == ["COMPLETE"] * SEARCHES[name][1]
    for t in trials:
        warmup = t.params["optim.schedule.warmup_steps"]
        assert type(warmup) is int and 0 <= warmup <= top, warmup
        assert isinstance(t.distributions["optim.schedule.warmup_steps"], optuna.distributions.IntDistribution)
        assert set(t.params) == set(preset("hparams_search", name)["hydra"]["sweeper"]["params"])
    text = run([str(sweep), "--tracking", str(work / "tracking")])
    lines = text.splitlines()
    trials_done = SEARCHES[name][1]
    assert lines[0] == f"study {sweep.name} (minimize): {trials_done} trials, {trials_done} complete"
    rows = [line.split() for line in lines[4 : 4 + trials_done]]
    assert sorted(int(r[0]) for r in rows) == list(range(trials_done))
    warmups = {t.number: t.params["optim.schedule.warmup_steps"] for t in trials}
    column = lines[3].split().index("optim.schedule.warmup_steps")
    assert {int(r[0]): r[column] for r in rows} == {n: str(w) for n, w in warmups.items()}  # printed as ints
    said = run(["plot", str(sweep), "-o", str(tmp_path / "study.png")])
    assert f"{trials_done} trials" in said
    assert Image.open(tmp_path / "study.png").size == (1680, 320)  # three searched parameters, the best so far
