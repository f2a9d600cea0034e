"""muP as one switch (dew.training.optim.mup): the model's ``mup`` brings the optimizer's muP groups into
the run, typed groups that conflict with them and architectures without muP are refused, and
``dew-train model=transformer model.config.mup=true`` trains with the groups in run.json."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from dew.config import ConfigError, ModelConfig, OptimConfig, ParamGroup, RunConfig
from dew.training.optim.build import mup_param_groups
from dew.training.optim.mup import mup_groups, with_mup_groups
from tests.training.conftest import dew_train
from tests.training.optim.test_build import TREE

TINY_LM = {"vocab_size": 64, "seq_len": 16, "hidden_size": 32, "depth": 1, "num_heads": 2, "mup_base_width": 16}


def test_an_architecture_without_mup_is_refused_naming_those_with_it(monkeypatch):
    from dew.models.simple_dit import SimpleDiT

    # every built-in architecture has muP: simple_dit without its muP fields stands for one that has not
    declared = SimpleDiT.declared()
    monkeypatch.setattr(SimpleDiT, "declared", classmethod(lambda cls: tuple(n for n in declared if "mup" not in n)))
    with pytest.raises(
        ConfigError,
        match="model.config.mup: architecture 'simple_dit' has no muP parametrization; muP is available on transformer",
    ):
        ModelConfig(architecture="simple_dit", config={"mup": True})


def test_a_dit_with_mup_on_carries_the_groups_its_parts_take():
    dit = {"input_size": 8, "in_channels": 1, "hidden_size": 32, "depth": 1, "num_heads": 2, "num_classes": 4}
    run = RunConfig(model=ModelConfig(architecture="simple_dit", config={**dit, "mup": True, "mup_base_width": 16}))
    resolved = with_mup_groups(run, _Model(run.model))
    no_decay, hidden = resolved.optim.param_groups
    assert (no_decay.weight_decay, hidden.lr_multiplier) == (0.0, 0.5)  # width 32 over base 16
    # hidden: the blocks' matrices, both adaLN modulations and the timestep MLP's hidden x hidden matrix;
    # the patch, timestep (its first layer) and class embeddings and the readout at the run's rate
    assert hidden.pattern == (
        "^(?:blocks/adaLN_modulation/kernel|blocks/attn/k/kernel|blocks/attn/o/kernel|blocks/attn/q/kernel|"
        "blocks/attn/v/kernel|blocks/mlp_in/kernel|blocks/mlp_out/kernel|final_layer/adaLN_modulation/kernel|"
        "t_embedder/mlp_out/kernel)$"
    )
    assert not any(
        re.search(g.pattern, p)
        for g in (no_decay, hidden)
        for p in ("x_embedder/kernel", "t_embedder/mlp_in/kernel", "y_embedder/embedding", "final_layer/linear/kernel")
    )


@pytest.mark.parametrize(
    "typed, path, theirs, ours",
    [
        # the run's decay (adamw's 1e-4) on a bias, where muP takes none
        (
            ParamGroup("mlp_in"),
            "blocks/mlp_in/bias",
            "lr_multiplier=1, weight_decay=0.0001",
            "lr_multiplier=1, weight_decay=0 (norms and biases take no weight decay)",
        ),
        # a hidden matrix at the full rate, where muP divides it by the width multiplier
        (
            ParamGroup("attn/q", lr_multiplier=1.0),
            "blocks/attn/q/kernel",
            "lr_multiplier=1, weight_decay=0.0001",
            "lr_multiplier=0.25, weight_decay=0.0001 (hidden matrices move at the rate / width multiplier 4)",
        ),
        # an embedding slowed down, where muP leaves it at the run's rate
        (
            ParamGroup("embed", lr_multiplier=0.1),
            "embed/embedding",
            "lr_multiplier=0.1, weight_decay=0.0001",
            "lr_multiplier=1, weight_decay=0.0001 (embeddings and the output head move at the run's rate and decay)",
        ),
    ],
)
def test_a_typed_group_that_conflicts_with_mup_is_refused_naming_both(typed, path, theirs, ours):
    optim = OptimConfig(param_groups=(ParamGroup("final_norm", weight_decay=0.0), typed))
    with pytest.raises(ConfigError) as err:
        mup_groups(optim, TREE, 4.0)
    assert (
        f"optim.param_groups[1] (pattern {typed.pattern!r}) conflicts with them: it gives {path} {theirs} "
        f"where muP gives {ours}"
    ) in str(err.value)


def test_typed_groups_that_restate_mup_give_mups_own_listing():
    listing = mup_param_groups(TREE, 4.0)
    agreeing = (
        ParamGroup("attn/q", lr_multiplier=0.25),
        ParamGroup("norm", weight_decay=0.0),
        ParamGroup("head"),
    )  # the head: the run's rate and decay, as muP's normal group
    assert mup_groups(OptimConfig(param_groups=agreeing), TREE, 4.0) == listing
    # with the run's decay 0, an undecayed group restates muP's norms and biases too
    assert mup_groups(OptimConfig(weight_decay=0.0, param_groups=(ParamGroup("bias"),)), TREE, 4.0) == listing
    assert mup_groups(OptimConfig(param_groups=listing), TREE, 4.0) == listing  # a record: itself again
    with pytest.raises(ValueError, match="pattern 'nope' matches no parameter"):
        mup_groups(OptimConfig(param_groups=(ParamGroup("nope"),)), TREE, 4.0)


class _Model:
    """The least an objective does for ``with_mup_groups``: build the module."""

    def __init__(self, model: ModelConfig) -> None:
        self.model = model

    def build(self, rngs: nnx.Rngs) -> nnx.Module:
        return self.model.build(rngs)


def test_a_run_with_mup_on_carries_the_groups_at_the_models_width_multiplier():
    run = RunConfig(model=ModelConfig(architecture="transformer", config={**TINY_LM, "mup": True}, dtype="float32"))
    resolved = with_mup_groups(run, _Model(run.model))
    params = nnx.state(run.model.build(nnx.Rngs(0)), nnx.Param)
    assert resolved.optim.param_groups == mup_param_groups(params, 2.0)  # hidden_size 32 over base 16
    assert [g.lr_multiplier for g in resolved.optim.param_groups] == [1.0, 0.5]
    assert with_mup_groups(resolved, _Model(run.model)) == resolved
    off = RunConfig(model=ModelConfig(architecture="transformer", config=TINY_LM, dtype="float32"))
    assert with_mup_groups(off, _Model(off.model)) is off


# ---------------------------------------------------------------------------------------- the CLI

CLI = [
    "model=transformer",
    "model.config.mup=true",
    "model.config.hidden_size=32",
    "model.config.depth=1",
    "model.config.num_heads=2",
    "model.config.mup_base_width=8",
    "model.dtype=float32",
    "data=token_windows",
    "data.path=tokens.bin",
    "data.vocab_size=64",
    "data.seq_len=16",
    "trainer.batch_size=4",
    "trainer.steps=2",
    "trainer.log_every=1",
    "trainer.eval_every=null",
    "trainer.checkpoint_every=null",
    "trainer.compilation_cache_dir=null",
    "trainer.checkpoint_dir=ck",
    "optim.learning_rate=0.01",
    # No samples at the end: the test reads the groups and the losses, and the end's samples traced
    # and compiled the transformer's decoding after its train step (0.7 s of the run's 2.3, its log says).
    "trainer.final_samples=false",
]


@pytest.mark.slow
def test_dew_train_with_mup_on_trains_with_the_mup_groups_in_run_json(workdir: Path):
    np.random.default_rng(0).integers(0, 64, 2049).astype("<u2").tofile(workdir / "tokens.bin")
    result = dew_train(*CLI, "trainer.name=mup", cwd=workdir)
    assert result.returncode == 0, result.stdout[-3000:]
    record = json.loads((workdir / "ck/mup/run.json").read_text())
    model = ModelConfig.from_dict(record["model"])
    params = nnx.state(model.build(nnx.Rngs(0)), nnx.Param)
    groups = [ParamGroup(**g) for g in record["optim"]["param_groups"]]
    assert tuple(groups) == mup_param_groups(params, 4.0)  # width 32 over base 8, no groups typed
    assert [(g.lr_multiplier, g.weight_decay) for g in groups] == [(1.0, 0.0), (0.25, None)]
    journal = [json.loads(line) for line in (workdir / "tracking/mup/journal.jsonl").read_text().splitlines()]
    losses = [e["train/loss"] for e in journal if "train/loss" in e]
    assert len(losses) == 2 and all(np.isfinite(losses)) and losses[0] < np.log(64) + 0.5

    again = dew_train(*CLI, "trainer.name=mup", cwd=workdir)  # the same command: the record's groups agree
    assert again.returncode == 0, again.stdout[-3000:]

    typed = dew_train(
        *CLI, "trainer.name=typed", 'optim.param_groups=[{"pattern": "mlp_up", "lr_multiplier": 1.0}]', cwd=workdir
    )
    assert typed.returncode == 2
    assert (
        "optim.param_groups[0] (pattern 'mlp_up') conflicts with them: it gives blocks/mlp_up/kernel lr_multiplier=1"
    ) in typed.stdout
    assert not (workdir / "ck" / "typed").exists()
