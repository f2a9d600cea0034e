"""dew.config: the spec's classes, strict from_dict, to_dict/from_dict/save/load round trips."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import typing
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dew.config import (
    ConfigError,
    Layout,
    LoRA,
    MeshSpec,
    ModelConfig,
    OptimConfig,
    ParamGroup,
    Ramp,
    RunConfig,
    TrainerConfig,
    Wandb,
)
from dew.contract.data import DataSpec, datasets
from dew.contract.evals import EvalTask
from dew.contract.models import architectures
from dew.contract.schedules import ScheduleSpec, schedules
from dew.contract.typed import JsonString, hints
from dew.recipe import Recipe


def test_importing_config_does_not_import_jax():
    code = "import sys, dew.config, dew.recipe, dew.commandline.schema; print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'optax', 'orbax', 'grain')))"  # noqa: E501
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------ hypothesis: any valid config


def _valid(cls: type, values: dict[str, Any]) -> Any:
    try:
        return cls(**values)
    except (ValueError, TypeError):
        return None


def strategy(tp: Any) -> st.SearchStrategy:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        inner, *_meta = typing.get_args(tp)
        return strategy(inner)
    if origin is Literal:
        return st.sampled_from(typing.get_args(tp))
    if origin in (typing.Union, __import__("types").UnionType):
        return st.one_of([strategy(a) for a in typing.get_args(tp)])
    if tp is type(None):
        return st.none()
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(1, 4)
    if tp is float:
        return st.sampled_from(FLOATS)
    if tp is str:
        return st.sampled_from(["a", "run/x", ".*", "blocks"])
    if origin is tuple:
        args = typing.get_args(tp)
        return st.lists(strategy(args[0]), max_size=2).map(tuple)
    if tp is DataSpec:
        return st.one_of([dataclass_strategy(c) for c in datasets.values()])
    if tp is ScheduleSpec:
        return st.one_of([dataclass_strategy(c) for c in schedules.values()])
    if dataclasses.is_dataclass(tp):
        return dataclass_strategy(tp)
    if origin is dict:
        return st.just({})
    raise NotImplementedError(tp)


def model_config_strategy() -> st.SearchStrategy:
    def for_arch(name: str) -> st.SearchStrategy:
        fields_cls = architectures[name].Fields
        types_ = hints(fields_cls)
        keys = [f.name for f in dataclasses.fields(fields_cls)]
        config = st.dictionaries(st.sampled_from(keys), st.nothing(), max_size=0)  # placeholder
        config = st.lists(st.sampled_from(keys), max_size=3, unique=True).flatmap(
            lambda ks: st.fixed_dictionaries({k: strategy(types_[k]) for k in ks})
        )
        return st.builds(
            lambda c, rest: _valid(ModelConfig, {"architecture": name, "config": c, **rest}),
            config,
            st.fixed_dictionaries(
                {
                    k: strategy(hints(ModelConfig)[k])
                    for k in ("dtype", "param_dtype", "matmul_precision", "attention_impl")
                }
            ),
        )

    return st.one_of([for_arch(n) for n in architectures]).filter(lambda m: m is not None)


NAMED = {
    "resolution": st.sampled_from([8, 32]),
    "channels": st.sampled_from([1, 3]),
    "eval_fraction": st.sampled_from([0.1, 0.5]),
    "val_fraction": st.sampled_from([0.0, 0.1]),
}
"""Fields of the data options whose type allows values they refuse: drawn from those they take."""
FLOATS = [0.0, 0.1, 0.5, 1.0, 2.5e-4]
"""The floats ``strategy`` draws."""
IN_RANGE = {
    ("LoRA", "targets"): st.lists(st.sampled_from(["a", "run/x", ".*", "blocks"]), min_size=1, max_size=2).map(tuple),
    ("OxfordFlowers102", "train_splits"): st.lists(
        st.sampled_from(["train", "val", "test"]), min_size=1, max_size=2
    ).map(tuple),
    ("MaskedDiffusionKnobs", "eps"): st.sampled_from([f for f in FLOATS if 0 < f < 1]),
    ("PowerSchedule", "a"): st.sampled_from([f for f in FLOATS if f > 0]),
    **{
        (c, "ema_decay"): st.sampled_from([f for f in FLOATS if 0 <= f < 1])
        for c in ("FlowMatchingKnobs", "NextTokenKnobs", "MaskedDiffusionKnobs")
    },
    ("FlowMatchingKnobs", "label_dropout"): st.sampled_from([f for f in FLOATS if 0 <= f < 1]),
    **{
        (c, "temperature"): st.sampled_from([f for f in FLOATS if f > 0])
        for c in ("NextTokenKnobs", "MaskedDiffusionKnobs")
    },
}
"""Fields whose type allows values they refuse (a range, a non-empty tuple), drawn from those they
take: each refused draw was a retry, and with these 395 of 545 records drawn for 150 examples were
thrown away (6.7 CPU-s of drawing). No value the field takes is left out of the draw that it had."""


def dataclass_strategy(cls: type) -> st.SearchStrategy:
    if cls is ModelConfig:
        return model_config_strategy()
    types_ = hints(cls)
    fields = {
        f.name: IN_RANGE[cls.__name__, f.name]
        if (cls.__name__, f.name) in IN_RANGE
        else NAMED[f.name]
        if f.name in NAMED
        else strategy(types_[f.name])
        for f in dataclasses.fields(cls)
        if f.init
    }
    if cls is TrainerConfig:
        fields["compilation_cache_dir"] = st.sampled_from([None, "/tmp/cache"])
        fields["name"] = st.sampled_from([None, "run", "sweep/3-lr=1"])
        fields["max_time"] = st.sampled_from([None, "90m", "00:12:00:00", 3600])
        fields["stall_timeout"] = st.sampled_from([None, "10m", 600, "00:00:30"])
    # Names a value or a task: drawn from those the field takes (the others, refused, are each a
    # retried draw of the whole record, which made the search for 150 records ten times slower).
    if cls.__name__ == "EvalTask":
        fields["name"] = st.sampled_from(["hellaswag", "arc.easy", "piqa-2"])
    if cls.__name__ == "Evals":
        fields["best"] = st.sampled_from([None, "eval/loss", "eval/web/loss"])
        fields["tasks"] = st.lists(
            dataclass_strategy(EvalTask), min_size=1, max_size=2, unique_by=lambda t: t.name
        ).map(tuple)
    if cls.__name__ == "EarlyStopping":
        fields["metric"] = st.sampled_from([None, "eval/loss", "eval/accuracy"])
    if cls is TrainerConfig:
        return st.fixed_dictionaries(fields).map(consistent_trainer).map(lambda v: _valid(cls, v)).filter(bool)
    return st.fixed_dictionaries(fields).map(lambda v: _valid(cls, v)).filter(lambda x: x is not None)


def consistent_trainer(v: dict[str, Any]) -> dict[str, Any]:
    """The drawn trainer fields with the rules across them kept (each broken one made the draw a
    retry, and most draws broke one): one of steps and epochs, a batch the micro-batches divide, the
    dynamics at a multiple of the logging, ``init_skip`` only beside ``init_from``, a batch ramp
    that reaches the batch (and no overfit_batches beside it), evaluations for early stopping."""
    if v["steps"] is not None and v["epochs"] is not None:
        v["epochs"] = None
    if v["steps"] is None and v["epochs"] is None:
        v["steps"] = 2
    if (ramp := v["batch_ramp"]) is not None:  # a batch whole increments above the ramp's start
        v["batch_size"] = ramp.start + ramp.increment * v["batch_size"]
        acc = v["accumulation"]
        v["batch_ramp"] = dataclasses.replace(ramp, start=ramp.start * acc, increment=ramp.increment * acc)
        v["overfit_batches"] = None
    v["batch_size"] *= v["accumulation"]
    if v["early_stopping"] is not None and v["eval_every"] is None:
        v["eval_every"] = 2
    if v["dynamics_every"] is not None:
        v["dynamics_every"] *= v["log_every"]
    if v["init_skip"] and v["init_from"] is None:
        v["init_from"] = "runs/base"
    return v


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(dataclass_strategy(Recipe))
def test_round_trip_any_recipe(cfg: Recipe):
    record = cfg.to_dict()
    assert json.loads(json.dumps(record)) == record  # JSON-safe
    assert Recipe.from_dict(record) == cfg


@pytest.mark.parametrize("dataset", sorted(datasets))
@pytest.mark.parametrize("schedule", [None, *sorted(schedules)])
@pytest.mark.parametrize("architecture", sorted(architectures))
def test_round_trip_every_registered_member(tmp_path, dataset, schedule, architecture):
    cfg = RunConfig(
        model=ModelConfig(architecture=architecture),
        data=datasets[dataset](),
        optim=OptimConfig(schedule=schedules[schedule]() if schedule else None),
    )
    record = cfg.to_dict()
    assert record["data"]["name"] == dataset
    if schedule:
        assert record["optim"]["schedule"]["name"] == schedule
    assert RunConfig.from_dict(record) == cfg
    path = cfg.save(str(tmp_path))
    assert path.endswith("run.json")
    assert RunConfig.load(str(tmp_path)) == cfg


@dataclasses.dataclass(frozen=True)
class Extra:
    depth: int = 3
    mode: Literal["a", "b"] = "a"


@dataclasses.dataclass(frozen=True)
class MyRun(RunConfig):
    extra: Extra = dataclasses.field(default_factory=Extra)


def test_subclass_round_trip(tmp_path):
    cfg = MyRun(extra=Extra(depth=7, mode="b"), trainer=TrainerConfig(steps=5))
    cfg.save(str(tmp_path))
    loaded = MyRun.load(str(tmp_path))
    assert type(loaded) is MyRun and loaded == cfg
    with pytest.raises(ConfigError, match="extra: unknown field"):
        RunConfig.from_dict(cfg.to_dict())  # the base class has no such field


def test_defaults_follow_the_spec():
    cfg = RunConfig()
    assert cfg.model == ModelConfig("simple_dit", {}, "bfloat16", None, None, "auto")
    assert cfg.data.name == "oxford_flowers102"
    assert cfg.optim.optimizer == "adamw" and cfg.optim.learning_rate == 0.00027
    assert cfg.optim.schedule is None and cfg.optim.weight_decay is None and cfg.optim.param_groups == ()
    assert cfg.optim.clip_grads == 0.0 and cfg.optim.state_dtype == "float32"
    t = cfg.trainer
    assert (t.name, t.checkpoint_dir, t.keep, t.batch_size, t.seed) == (None, "./checkpoints", 2, 32, 0)
    assert (t.steps, t.epochs, t.log_every, t.eval_every, t.checkpoint_every) == (None, None, 100, "epoch", "epoch")
    assert (t.accumulation, t.batch_ramp, t.dynamic_scale, t.profile, t.wandb) == (1, None, False, None, None)
    assert t.mesh == MeshSpec() and t.layout == Layout() and t.multi_host is None and t.quantization is None
    assert cfg.objective is None and cfg.lora is None


# ------------------------------------------------------------------------ strict: named paths


def _record(**changes: Any) -> dict[str, Any]:
    record = RunConfig(trainer=TrainerConfig(steps=3)).to_dict()
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = record
        for p in parents:
            node = node[p]
        if value is KeyError:
            del node[leaf]
        else:
            node[leaf] = value
    return record


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"optim__schedule": {"name": "cosine", "warmup_steps": "ten", "floor_ratio": 0.0}},
            r"optim\.schedule\.warmup_steps: expected int, found str 'ten'",
        ),
        ({"trainer__nope": 1}, r"trainer\.nope: unknown field of TrainerConfig"),
        ({"trainer__keep": KeyError}, r"trainer\.keep: missing field of TrainerConfig"),
        (
            {"optim__optimizer": "sgd"},
            r"optim\.optimizer: expected one of 'adam', 'adamw', 'lamb', 'muon', 'muonclip', found str 'sgd'",
        ),
        (
            {"trainer__eval_every": "week"},
            r"trainer\.eval_every: expected int or one of 'epoch' or null, found str 'week'",
        ),
        ({"trainer__batch_size": True}, r"trainer\.batch_size: expected int, found bool True"),
        ({"trainer__batch_size": 1.5}, r"trainer\.batch_size: expected int, found float 1.5"),
        (
            {"data": {"name": "mnist"}},
            r"data\.name: expected one of digits, oxford_flowers102, text_stream, token_windows|data\.name: expected one of",  # noqa: E501
        ),
        (
            {"model__config": {"depht": 2}},
            r"model\.config: architecture 'simple_dit' takes no field 'depht'; it takes input_size",
        ),
        ({"model__config": {"depth": "deep"}}, r"model\.config\.depth: expected int, found str 'deep'"),
        ({"trainer__wandb": {"project": "p", "entity": None}}, r"trainer\.wandb\.offline: missing field"),
        ({"trainer__batch_ramp": {"start": 10, "increment": 8, "records": 100}}, r"trainer: trainer\.batch_ramp"),
        # Every float is finite (NaN never equals itself: a record holding one could never be resumed).
        ({"optim__learning_rate": float("nan")}, r"optim\.learning_rate: expected a finite float, found float nan"),
        ({"optim__clip_grads": float("inf")}, r"optim\.clip_grads: expected a finite float, found float inf"),
        ({"optim__weight_decay": float("nan")}, r"optim\.weight_decay: expected a finite float, found float nan"),
        (
            {"optim__schedule": {"name": "cosine", "warmup_steps": 1, "floor_ratio": float("nan")}},
            r"optim\.schedule\.floor_ratio: expected a finite float",
        ),
        (
            {"optim__param_groups": [{"pattern": "b", "lr_multiplier": float("inf"), "weight_decay": None}]},
            r"optim\.param_groups\[0\]\.lr_multiplier: expected a finite float",
        ),
        ({"lora": {"rank": 2, "alpha": float("-inf"), "targets": [".*"]}}, r"lora\.alpha: expected a finite float"),
        ({"model__config": {"mlp_ratio": float("nan")}}, r"model\.config\.mlp_ratio: expected a finite float"),
        ({"optim__learning_rate": 10**400}, r"optim\.learning_rate: expected a finite float, found int"),
        # Integers that cannot work past a bound say the bound.
        ({"trainer__steps": 2**31}, r"trainer\.steps=2147483648 exceeds 2147483647"),
        ({"trainer__batch_size": 10**20}, r"trainer\.batch_size=100000000000000000000 exceeds 2147483647"),
        ({"trainer__steps": None, "trainer__epochs": 2**40}, r"trainer\.epochs=1099511627776 exceeds 2147483647"),
        ({"trainer__checkpoint_every": 2**33}, r"trainer\.checkpoint_every=8589934592 exceeds 2147483647"),
        ({"trainer__seed": 2**63}, r"trainer\.seed=9223372036854775808 must lie in"),
    ],
)
def test_from_dict_names_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_dict(_record(**changes))


def test_a_run_record_is_strict_json(tmp_path):
    RunConfig(trainer=TrainerConfig(steps=3)).save(str(tmp_path))
    json.loads((tmp_path / "run.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in run.json"))
    bad = OptimConfig()
    object.__setattr__(bad, "learning_rate", float("nan"))  # past the conversion, as a notebook could
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        dataclasses.replace(RunConfig(), optim=bad).save(str(tmp_path / "nan"))
    assert not (tmp_path / "nan" / "run.json").exists()


def test_json_dict_accepts_a_json_string():
    record = _record(model__config='{"depth": 2, "hidden_size": 64, "num_heads": 4}')
    assert RunConfig.from_dict(record).model.config == {"depth": 2, "hidden_size": 64, "num_heads": 4}
    with pytest.raises(ConfigError, match=r"model\.config: expected JSON"):
        RunConfig.from_dict(_record(model__config="{depth: 2"))


def test_param_groups_accept_a_json_list():
    record = _record(optim__param_groups='[{"pattern": "bias", "lr_multiplier": 2.0, "weight_decay": 0.0}]')
    assert RunConfig.from_dict(record).optim.param_groups == (ParamGroup("bias", 2.0, 0.0),)


def test_model_fields_and_precision_settings():
    m = ModelConfig(config={"depth": 2, "dtype": "float32"}, dtype="float32", param_dtype="bfloat16")
    assert m.fields() == {"depth": 2, "dtype": "float32", "param_dtype": "bfloat16", "attention_impl": "auto"}
    assert m.precision_settings() == frozenset({"param_dtype", "attention_impl"})
    assert ModelConfig.from_dict(m.__class__(**dataclasses.asdict(m)).__dict__) == m


def test_a_precision_set_twice_must_agree():
    """model.dtype and model.config.dtype are one setting: disagreeing is an error naming both."""
    with pytest.raises(ConfigError, match=r"model.config.dtype='float32' disagrees with model.dtype='bfloat16'"):
        ModelConfig(config={"dtype": "float32"}, dtype="bfloat16")
    with pytest.raises(
        ConfigError,
        match=r"model.config.param_dtype='float32' disagrees with "
        r"model.param_dtype='bfloat16'",
    ):
        ModelConfig("transformer", {"param_dtype": "float32"}, dtype="float32", param_dtype="bfloat16")
    assert ModelConfig(config={"dtype": "float32"}, dtype="float32").fields()["dtype"] == "float32"
    # Unset on the ModelConfig side (param_dtype None): the config's own value stands alone.
    assert ModelConfig(config={"param_dtype": "bfloat16"}, dtype="bfloat16").fields()["param_dtype"] == "bfloat16"


def test_load_of_a_subclass_record_names_the_class_that_wrote_it(tmp_path):
    from dew.recipe import Recipe

    Recipe().save(str(tmp_path))
    with pytest.raises(ConfigError, match=r"written by dew\.recipe\.Recipe .*dew\.recipe\.Recipe\.load\("):
        RunConfig.load(str(tmp_path))
    assert Recipe.load(str(tmp_path)) == Recipe()


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no run record"):
        RunConfig.load(str(tmp_path))
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(ConfigError, match="run.json: not a JSON run record"):
        RunConfig.load(str(tmp_path))
    (tmp_path / "run.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(ConfigError, match=f"{tmp_path / 'run.json'}: not a JSON run record .*utf-8"):
        RunConfig.load(str(tmp_path))
    (tmp_path / "run.json").write_text(json.dumps({**RunConfig().to_dict(), "extra": 1}))
    with pytest.raises(ConfigError, match=r"run.json: extra: unknown field"):
        RunConfig.load(str(tmp_path))


def test_one_reader_gives_the_record_as_written_and_typed(tmp_path):
    """``RunRecord.read`` is the one reader of run.json: the values as written (what dew-runs and the
    resume rules compare) and the typed view (what RunConfig.load and dew-sample rebuild from), and
    each way a record cannot be read as one error with a reason that leaves the path out."""
    from dew.config import NoRunRecord, RunRecord, RunRecordError

    recipe = Recipe(trainer=TrainerConfig(steps=7))
    with pytest.raises(NoRunRecord) as missing:
        RunRecord.read(tmp_path)
    assert missing.value.reason.startswith("no run.json: not a dew run directory")
    recipe.save(str(tmp_path))
    record = RunRecord.read(tmp_path)
    assert record.values == json.loads((tmp_path / "run.json").read_text()) == recipe.to_dict()
    assert record.values["trainer"]["steps"] == 7 and record.typed(Recipe) == recipe
    with pytest.raises(RunRecordError, match=r"written by dew\.recipe\.Recipe") as wrong_class:
        record.typed(RunConfig)
    assert wrong_class.value.path == str(tmp_path / "run.json")
    for text, reason in [
        ('{"model": {"arch', r"not a JSON run record \(.*\): cut off mid-write, or edited"),
        ("[1, 2]", r"not a dew run record \(no trainer section\)"),
        ('{"model": {}}', r"not a dew run record \(no trainer section\)"),
    ]:
        (tmp_path / "run.json").write_text(text)
        with pytest.raises(RunRecordError) as bad:
            RunRecord.read(tmp_path)
        assert (
            re.fullmatch(reason, bad.value.reason) and str(bad.value) == f"{tmp_path / 'run.json'}: {bad.value.reason}"
        )


def test_a_record_written_before_a_field_was_added_is_read_with_its_default(tmp_path):
    """A run an older dew wrote lacks the fields added since (``ADDED_FIELDS``): the one reader fills
    them in with the value such a run behaves as, so it is resumed, evaluated and sampled; a record
    lacking any other field is still refused, naming it."""
    from dew.config import RunRecord, RunRecordError
    from dew.contract.config import ADDED_FIELDS, with_added_fields
    from dew.data.specs import TokenWindows

    recipe = Recipe(trainer=TrainerConfig(steps=7), data=TokenWindows(path="train.bin"))  # data.documents is its
    recipe.save(str(tmp_path))
    written = json.loads((tmp_path / "run.json").read_text())
    older = json.loads(json.dumps(written))
    for dotted in ADDED_FIELDS:
        *parents, leaf = dotted.split(".")
        section = older
        for key in parents:
            section = section[key]
        del section[leaf]
    (tmp_path / "run.json").write_text(json.dumps(older))
    record = RunRecord.read(tmp_path)
    assert record.values == written and record.typed(Recipe) == recipe
    images = {"trainer": {}, "data": {"name": "digits", "eval_fraction": 0.1}}
    assert with_added_fields(images)["data"] == images["data"]  # a token dataset's field is not given to another
    del older["trainer"]["seed"]
    (tmp_path / "run.json").write_text(json.dumps(older))
    with pytest.raises(RunRecordError, match=r"trainer\.seed: missing field of TrainerConfig"):
        RunRecord.read(tmp_path).typed(Recipe)


def test_trainer_lengths():
    class Data:
        batch_size, num_records, resumable = 10, 105, True

    class Stream:
        batch_size, num_records, resumable = 10, None, False

    t = TrainerConfig(batch_size=10, epochs=2)
    assert t.total_steps(Data()) == 21 and t.eval_interval(Data()) == 10 and t.checkpoint_interval(Data()) == 10
    assert TrainerConfig(steps=7, eval_every=3, checkpoint_every=None).total_steps(Data()) == 7
    with pytest.raises(ValueError, match="no length"):
        TrainerConfig().total_steps(Data())
    with pytest.raises(ValueError, match="set exactly one"):
        TrainerConfig(steps=1, epochs=1)
    with pytest.raises(ValueError, match="stream"):
        TrainerConfig(steps=5, checkpoint_every=None).eval_interval(Stream())
    with pytest.raises(ValueError, match="cannot report a read position"):
        TrainerConfig(steps=5, eval_every=None, checkpoint_every=5).checkpoint_interval(Stream())
    assert TrainerConfig(steps=5, eval_every=2, checkpoint_every=None).checkpoint_interval(Stream()) is None
    ramp = TrainerConfig(batch_size=16, epochs=1, batch_ramp=Ramp(start=4, increment=4, records=48))
    # 16 records a stage: 4 steps of 4, 2 of 8, 2 of 12 (ceil 16/12: 24 records), so 56 records in
    # 8 steps; the 49 left give 3 full steps of 16.
    assert ramp.total_steps(Data()) == 4 + 2 + 2 + 3
    assert ramp.stages() == [(4, 4), (8, 2), (12, 2), (16, 0)]
    # A ramp spanning fewer records than it has stages still takes one step at each stage.
    assert Ramp(start=4, increment=4, records=2).stages(16) == [(4, 1), (8, 1), (12, 1), (16, 0)]
    assert TrainerConfig(steps=3, batch_size=16).stages() == [(16, 0)]


def test_records_need_their_required_fields():
    with pytest.raises(TypeError):
        Wandb()  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="rank"):
        LoRA(rank=0)
    with pytest.raises(ValueError, match="mesh"):
        MeshSpec(data=-1, fsdp=-1)
    assert MeshSpec(data=-1, fsdp=2).shape(8) == {"data": 4, "fsdp": 2, "tensor": 1}
    with pytest.raises(ValueError, match="needs 6 devices"):
        MeshSpec(data=3, fsdp=2).shape(8)
    with pytest.raises(ValueError, match="escape|relative path"):
        TrainerConfig(name="../elsewhere")
    assert JsonString  # the marker class is public for recipes' own JSON fields


def test_the_epoch_cadence_makes_at_most_ten_events_a_run():
    """docs/training.md, "Length and cadences": "epoch" is one pass, or the fewest whole passes that
    keep a run to EPOCH_EVENTS evaluations (checkpoints); a number of steps is kept as given."""
    from dew.contract.config import EPOCH_EVENTS, epochs_between

    class Digits:  # 1,617 records at batch 256: 6 steps an epoch
        batch_size, num_records, resumable = 256, 1617, True

    assert EPOCH_EVENTS == 10
    assert [epochs_between(total, 6) for total in (1, 6, 60, 61, 120, 121, 200)] == [1, 1, 1, 2, 2, 3, 4]
    for steps, every in ((30, 6), (60, 6), (61, 12), (200, 24), (900, 90)):
        t = TrainerConfig(batch_size=256, steps=steps)
        assert t.eval_interval(Digits()) == every and t.checkpoint_interval(Digits()) == every
        assert steps // every <= EPOCH_EVENTS
    assert TrainerConfig(batch_size=256, epochs=30).eval_interval(Digits()) == 6 * 4  # 189 steps: every 4 epochs
    explicit = TrainerConfig(batch_size=256, steps=200, eval_every=6, checkpoint_every=7)
    assert explicit.eval_interval(Digits()) == 6 and explicit.checkpoint_interval(Digits()) == 7
