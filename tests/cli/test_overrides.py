"""One override parser for every command: each form dew-train takes (a plain value, a quoted string,
a list, a JSON dict, ``+key=``, ``~key``, a group's option, a dotted key, ``null``) given to
``dew-eval``, ``dew-sample`` and ``dew-export`` on a finished run gives the value dew-train gives it
(each command's ``--cfg`` against ``dew-train --cfg job``, typed alike); the three commands run for
real with several forms at once on one tiny run, which the module trains once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import SUITE_CACHE, cli_env, dew
from tests.training.conftest import journal, losses

SEQ = 16
MODEL = '{"hidden_size": 32, "depth": 1, "num_heads": 4, "num_kv_heads": 2}'
"""The run's model fields, as a JSON dict: given again, the same model."""
DEEPER = '{"hidden_size": 32, "depth": 2, "num_heads": 4}'
"""Another model's, as a JSON dict."""
COMMANDS = ("dew.cli.eval", "dew.cli.sample", "dew.cli.export")


def _training(data: Path) -> list[str]:
    return [
        "data=token_windows",
        f"data.path={data / 'train.bin'}",
        f"data.val_path={data / 'val.bin'}",
        f"data.seq_len={SEQ}",
        "model.config={hidden_size: 32, depth: 1, num_heads: 4, num_kv_heads: 2}",  # Hydra's dict: ~ takes a key
        "model.dtype=float32",
        "trainer.batch_size=8",
        "trainer.steps=2",
        "trainer.eval_every=2",
        "trainer.checkpoint_every=2",
        "trainer.log_every=1",
        f"trainer.compilation_cache_dir={SUITE_CACHE}",
    ]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A two-step next-token run on byte tokens, trained in this process as dew-train trains it."""
    import numpy as np

    from dew.build import build_run
    from dew.commandline.overrides import hydra_form
    from dew.data.prepare import prepare
    from dew.objectives.metrics import builtin_metrics
    from dew.recipe import Recipe
    from tests.training.mesh_runs import compose

    root = tmp_path_factory.mktemp("overrides")
    words = np.random.default_rng(0).choice(["the", "quick", "brown", "fox", "jumps", "over", "a", "dog"], 2000)
    (root / "train.txt").write_text(" ".join(words[:1800]))
    (root / "val.txt").write_text(" ".join(words[1800:]))
    prepare([str(root / "train.txt")], str(root / "bytes"), val=[str(root / "val.txt")])
    overrides = hydra_form([*_training(root / "bytes"), f"trainer.checkpoint_dir={root / 'ck'}"], Recipe)
    recipe, objective, dataset = build_run(compose(*overrides))
    recipe.train(objective, dataset, name="lm", metrics=builtin_metrics(objective))
    return root / "ck" / "lm"


def _at(values: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        values = values[part]
    return values


def _shown(command: str, run: Path, *overrides: str) -> dict[str, Any]:
    """The typed config ``command --cfg`` prints for ``run`` with ``overrides``."""
    extra = ["--to", str(run.parent / "unused")] if command == "dew.cli.export" else []
    out = dew(str(run), *extra, "--cfg", *overrides, cwd=run.parent, script=command, timeout=120)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def _dew_train(run: Path, *overrides: str) -> dict[str, Any]:
    """The typed config ``dew-train --cfg job`` composes from ``overrides``."""
    from dew.recipe import Recipe

    out = dew("--cfg", "job", "--resolve", *overrides, cwd=run.parent, timeout=120)
    assert out.returncode == 0, out.stderr
    return Recipe.from_dict(yaml.safe_load(out.stdout)).to_dict()


FORMS = [
    # (the overrides, the field compared, whether dew-train composes them over the run's own)
    (["trainer.log_every=3"], "trainer.log_every", True),
    (["trainer.name='a run'"], "trainer.name", True),
    (["trainer.layout.rules.kv=[tensor,fsdp]"], "trainer.layout.rules.kv", True),
    ([f"model.config={DEEPER}"], "model.config", True),
    (["+optim.optimizer_opts.b1=0.8"], "optim.optimizer_opts", True),
    (["~model.config.num_kv_heads"], "model.config.num_kv_heads", True),
    (["model=transformer_tiny", "model.config.depth=3"], "model", False),
    (["trainer.mesh.data=1"], "trainer.mesh", True),
    (["data.val_path=null"], "data.val_path", True),
]


@pytest.mark.parametrize("overrides, field, over_the_run", FORMS, ids=[f[1] for f in FORMS])
def test_each_form_means_in_every_command_what_it_means_to_dew_train(run, overrides, field, over_the_run):
    from dew.contract.rundir import RUN_RECORD

    trained = _training(run.parent.parent / "bytes") if over_the_run else []
    expected = _dew_train(run, *trained, *overrides)
    recorded = json.loads((run / RUN_RECORD).read_text())
    for command in COMMANDS:
        shown = _shown(command, run, *overrides)
        if field.endswith("num_kv_heads"):  # deleted: absent on both sides, present in the record
            assert field.split(".")[-1] not in _at(shown, "model.config") and "num_heads" in _at(shown, "model.config")
            assert field.split(".")[-1] not in _at(expected, "model.config")
            assert _at(recorded, field) == 2
            continue
        assert _at(shown, field) == _at(expected, field), (command, field)
        assert _at(shown, field) != _at(recorded, field), (command, field)  # the override changed the record
        # what the override does not name is the record's
        assert _at(shown, "trainer.checkpoint_dir") == _at(recorded, "trainer.checkpoint_dir")


def test_a_refused_form_is_one_line_in_every_command(run):
    for command in COMMANDS:
        for overrides, says in (
            (["trainer.nope=1"], "trainer.nope: unknown field"),
            (["trainer.steps=1,2"], "takes one configuration"),
            (["model.config={depth: "], "cannot parse the value"),
            (["optim.schedule.warmup_steps=3"], "optim.schedule is unset in this run"),
        ):
            extra = ["--to", str(run.parent / "unused")] if command == "dew.cli.export" else []
            out = dew(str(run), *extra, "--cfg", *overrides, cwd=run.parent, script=command, timeout=120)
            assert out.returncode == 2 and says in out.stderr, (command, out.stderr)
            assert len(out.stderr.strip().splitlines()) == 1, out.stderr


SAME_MODEL = [
    f"model.config={MODEL}",
    "trainer.name='the same run'",
    "+optim.optimizer_opts.b1=0.8",
    "trainer.mesh.data=1",
    "trainer.layout.rules.kv=[tensor]",
]
"""Forms that change the record but not the model its checkpoints hold."""


def test_the_commands_run_with_the_forms(run):
    """dew-eval gives the journal's loss, dew-sample the same text, dew-export the run's model, with
    forms that leave the model as it was; one that changes it is refused in one line."""
    env, cwd = cli_env(), run.parent
    data = [f"data.path={run.parent.parent / 'bytes' / 'train.bin'}", "data=token_windows"]
    data += [f"data.val_path={run.parent.parent / 'bytes' / 'val.bin'}", f"data.seq_len={SEQ}"]
    out = run.parent / "eval.json"
    evaluated = dew(str(run), *SAME_MODEL, *data, "--out", str(out), cwd=cwd, env=env, script="dew.cli.eval")
    assert evaluated.returncode == 0, evaluated.stderr
    loss = json.loads(out.read_text())["metrics"]["eval/loss"]
    assert abs(loss - losses(journal(run.parent.parent, "lm"), "eval/loss")[2]) < 1e-6

    texts = []
    for extra in ([], SAME_MODEL):
        target = run.parent / f"samples-{len(extra)}.txt"
        sampled = dew(str(run), "--count", "2", "--out", str(target), *extra, cwd=cwd, env=env, script="dew.cli.sample")
        assert sampled.returncode == 0, sampled.stderr
        texts.append(target.read_text())
    assert texts[0] == texts[1] and texts[0].count("--- sample") == 2

    hf = run.parent / "hf"
    exported = dew(str(run), "--to", str(hf), *SAME_MODEL, cwd=cwd, env=env, script="dew.cli.export")
    assert exported.returncode == 0, exported.stderr
    config = json.loads((hf / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_key_value_heads"]) == (32, 1, 2)

    changed = dew(str(run), "model.config.depth=2", cwd=cwd, env=env, script="dew.cli.sample")
    assert changed.returncode == 2 and "model.config.depth: 1 -> 2" in changed.stderr, changed.stderr
    assert len(changed.stderr.strip().splitlines()) == 1


def test_a_hugging_face_directory_of_another_model_is_named(tmp_path):
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    out = dew(str(gpt2), "data=token_windows", "data.path=x.bin", cwd=tmp_path, script="dew.cli.eval", timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    for says in ("holds a GPT2LMHeadModel", "model_type 'gpt2'", "LlamaForCausalLM"):
        assert says in out.stderr, out.stderr
    assert "holds a Llama" not in out.stderr
