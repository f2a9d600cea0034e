"""docs/extending.md, followed literally: its code blocks, each headed by the file it belongs to, make a
plugin package in a temporary directory, which goes on the path with its entry-point metadata (what
``pip install`` would write) and trains from the command line; its optimizer example runs in this
process. Also the registry's own rules: a name registered twice, plugins that fail to import."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import tomllib
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, cli_env, dew, tree

GUIDE = REPO / "docs" / "extending.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def guide_files() -> dict[str, str]:
    """The guide's code blocks by the file their first line names (``# path``), concatenated in
    the order the guide gives them."""
    files: dict[str, str] = {}
    for _, block in FENCE.findall(GUIDE.read_text()):
        first = block.splitlines()[0]
        if first.startswith("# ") and re.fullmatch(r"# [\w./-]+\.(py|yaml|toml)", first):
            path = first[2:]
            files[path] = files.get(path, "") + ("\n\n" if path in files else "") + block
    return files


def guide_commands() -> list[list[str]]:
    commands = []
    for _lang, block in FENCE.findall(GUIDE.read_text()):
        for line in block.splitlines():
            if line.startswith("dew-train"):
                commands.append(shlex.split(line.split(" #")[0]))
    return commands


def install(root: Path) -> Path:
    """Write the guide's package under ``root`` with the ``.dist-info`` metadata an install would
    write (its entry points from the guide's pyproject.toml); returns the directory to put on the
    path."""
    files = guide_files()
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    project = tomllib.loads(files["pyproject.toml"])["project"]
    info = root / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    points = "".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items())
        for group, entries in project["entry-points"].items()
    )
    (info / "entry_points.txt").write_text(points)
    return root


def test_the_guide_covers_every_kind():
    files = guide_files()
    assert {
        "pyproject.toml",
        "dew_blobs/__init__.py",
        "dew_blobs/layers.py",
        "dew_blobs/loss.py",
        "dew_blobs/conf/model/mlp.yaml",
        "dew_blobs/conf/data/blobs.yaml",
        "dew_blobs/conf/trainer/trackers/ledger.yaml",
        "signum.py",
    } <= set(files)
    text = files["dew_blobs/__init__.py"]
    kinds = ("datasets", "architectures", "objectives", "hooks", "trackers")
    for registry in (f"{kind}.register" for kind in kinds):
        assert registry in text
    assert guide_commands(), "the guide trains its plugin from the command line"


@pytest.mark.slow
def test_a_plugin_from_outside_the_repository_trains_from_the_cli(tmp_path: Path):
    package = install(tmp_path / "site")
    env = cli_env(
        PYTHONPATH=os.pathsep.join([str(package), str(REPO), os.environ.get("PYTHONPATH", "")]),
        XLA_FLAGS="--xla_backend_optimization_level=0",
    )
    work = tmp_path / "work"
    work.mkdir()

    shown = dew("--help", cwd=work, env=env)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"^model: .*\bmlp\b", shown.stdout, re.M) and re.search(r"^data: .*\bblobs\b", shown.stdout, re.M)

    (command,) = guide_commands()
    args = [("trainer.steps=2" if a.startswith("trainer.steps=") else a) for a in command[1:]]
    args += [
        "trainer.checkpoint_dir=ck",
        "trainer.log_every=1",
        "trainer.eval_every=2",
        "trainer.compilation_cache_dir=null",
    ]
    result = dew(*args, cwd=work, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]

    run = work / "ck" / "blobs"
    # A classifier draws no samples: the trainer does not suggest dew-sample, which refuses it in a line.
    assert "next: dew-runs plot" in result.stderr and "dew-sample" not in result.stdout + result.stderr
    sampled = dew(str(run), cwd=work, env=env, script="dew.cli.sample")
    assert sampled.returncode == 2 and "Traceback" not in sampled.stderr, sampled.stderr[-3000:]
    assert sampled.stderr.strip().splitlines() == [
        "dew-sample: error: the run's objective 'classification' cannot sample: it defines neither sample_grid "
        "(images) nor sample_text (text)"
    ]
    record = json.loads((run / "run.json").read_text())
    assert record["model"]["architecture"] == "mlp"
    assert record["model"]["config"] == {"hidden": 64, "depth": 2, "features": 8, "classes": 4}
    assert record["data"]["name"] == "blobs" and record["classification"]["label_smoothing"] == 0.0
    from dew.contract.journal import read_journal

    journal = read_journal(work / "tracking" / "blobs" / "journal.jsonl")
    first = next(r for r in journal if r.get("step") == 1 and "train/loss" in r)
    assert abs(first["train/loss"] - math.log(4)) < 1e-5  # the zero head: uniform logits over 4 classes
    assert 0.0 <= first["train/accuracy"] <= 1.0
    assert any("eval/accuracy" in r for r in journal)
    ema = {r["step"]: r["train/loss_ema"] for r in journal if "train/loss_ema" in r}  # the guide's hook, every step
    assert sorted(ema) == [1, 2] and ema[1] == first["train/loss"]

    bad = dew(*args[:-4], "data.spread=-1", "trainer.checkpoint_dir=bad", cwd=work, env=env)
    assert bad.returncode == 2 and "data.spread=-1" in bad.stderr and "Traceback" not in bad.stderr
    assert not (work / "bad").exists()


def test_the_guide_optimizer_matches_its_definition():
    import jax

    from dew.training.optim.registry import optimizers

    files = guide_files()
    blocks = [b for lang, b in FENCE.findall(GUIDE.read_text()) if lang == "python"]
    notebook = next(b for b in blocks if b.startswith("# in a notebook"))
    scope: dict = {}
    try:
        exec(compile(files["signum.py"], "signum.py", "exec"), scope)
        exec(compile(notebook, "notebook", "exec"), scope)
        np.testing.assert_allclose(np.asarray(scope["updates"]["w"]), 0.1)
        opt, params = scope["opt"], scope["params"]
        g1, g2 = np.full((2, 3), -4.0, np.float32), np.array([[1, 2, 3], [5, -1, 4]], np.float32)
        _, state = opt.tx.update({"w": g1}, opt.tx.init(params), params)
        second, _ = opt.tx.update({"w": g2}, state, params)
        momentum = g2 + 0.9 * g1  # optax.trace: m = g + beta * m
        rate = float(opt.learning_rate(jax.numpy.asarray(1)))
        np.testing.assert_allclose(np.asarray(second["w"]), -rate * np.sign(momentum))
        with pytest.raises(ValueError, match=r"optim.optimizer_opts.momentum=1.5 must lie in \[0, 1\)"):
            optimizers["signum"].resolve({"momentum": 1.5})
    finally:
        optimizers._entries.pop("signum", None)


def test_a_name_registered_twice_is_refused():
    from dew.contract.models import Architecture, architectures

    assert "transformer" in architectures  # reading a registry registers dew's own parts, then the plugins
    with pytest.raises(ValueError, match="architecture 'transformer' is registered twice"):
        architectures.register("transformer")(type("Impostor", (Architecture,), {}))
    assert architectures["transformer"].__module__ == "dew.models.transformer"


def test_a_broken_plugin_is_named(tmp_path: Path):
    site = tmp_path / "site"
    (site / "broken_plugin").mkdir(parents=True)
    (site / "broken_plugin" / "__init__.py").write_text("raise RuntimeError('no GPU here')\n")
    info = site / "broken_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[dew.plugins]\nbroken = broken_plugin\n")
    env = cli_env(PYTHONPATH=os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")]))
    work = tmp_path / "work"
    work.mkdir()
    result = dew("--cfg", "job", cwd=work, env=env)
    assert result.returncode != 0
    assert "dew plugin 'broken' = 'broken_plugin' (from broken-plugin) failed to import" in result.stderr
    assert "no GPU here" in result.stderr
    assert tree(work) == []
    quiet = dew("--cfg", "job", cwd=work, env={**env, "DEW_NO_PLUGINS": "1"})
    assert quiet.returncode == 0, quiet.stderr


OWN_MODULE = {
    "simple_dit": "dew/models/simple_dit.py",
    "transformer": "dew/models/transformer.py",
    "flow_matching": "dew/objectives/flow_matching.py",
    "masked_diffusion": "dew/objectives/masked_diffusion.py",
    "next_token": "dew/objectives/next_token.py",
    "muon": "dew/training/optim/muon.py",
    "muonclip": "dew/training/optim/muonclip.py",
}


@pytest.mark.parametrize("name", sorted(OWN_MODULE))
def test_a_part_is_named_only_in_its_own_module(name):
    """Outside its own module, no file of dew names a particular architecture, objective or
    optimizer: the rest asks the registry. dew/contract/config.py is the contract, which names the default
    architecture and the optimizers."""
    quoted = re.compile(rf"[\"']{name}[\"']")
    naming = {p.relative_to(REPO).as_posix() for p in (REPO / "dew").rglob("*.py") if quoted.search(p.read_text())}
    assert naming <= {OWN_MODULE[name], "dew/contract/config.py"}, naming
    assert OWN_MODULE[name] in naming


def test_parts_pair_by_role_and_kind():
    from dew.build import objective_spec
    from dew.config import ModelConfig
    from dew.contract.data import datasets
    from dew.recipe import Recipe

    lm = ModelConfig(architecture="transformer")
    assert objective_spec(Recipe(model=lm, data=datasets["token_windows"](path="x")), "tokens").name == "next_token"
    assert objective_spec(Recipe(data=datasets["digits"]()), "image").name == "flow_matching"
    assert objective_spec(Recipe(data=datasets["token_windows"](path="x")), "tokens").name == "masked_diffusion"
    with pytest.raises(
        ValueError,
        match=r"no objective trains model.architecture='transformer' \(a causal_lm\) "
        r"on data='digits' \(image data\); objectives train flow_matching: a "
        r"denoiser on image data",
    ):
        objective_spec(Recipe(model=lm, data=datasets["digits"]()), "image")
    with pytest.raises(
        ValueError,
        match=r"objective='flow_matching' cannot train model.architecture='transformer' "
        r"\(a causal_lm\) on tokens data; it trains a denoiser on image data",
    ):
        objective_spec(Recipe(model=lm, objective="flow_matching"), "tokens")


def test_plugin_conf_dirs_are_read_again_when_a_plugin_is_installed_on_the_path(tmp_path: Path, monkeypatch):
    """The answer is kept per path: a plugin installed since (into a directory already on it, or
    on a path added to it) is found, and an unchanged path is answered without reading again."""
    import importlib.metadata

    from dew.contract import registry

    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    before = registry.plugin_conf_dirs()
    reads = []
    entry_points = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: reads.append(kw) or entry_points(**kw))
    assert registry.plugin_conf_dirs() == before and reads == []
    (site / "conf_plugin" / "conf" / "model").mkdir(parents=True)
    (site / "conf_plugin" / "__init__.py").write_text("")
    info = site / "conf_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: conf-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[dew.plugins]\nconf_plugin = conf_plugin\n")
    importlib.invalidate_caches()
    assert registry.plugin_conf_dirs() == [*before, str(site / "conf_plugin" / "conf")] and len(reads) == 1
