"""Bad input to dew-train: one clear message, a non-zero exit, no traceback, nothing on disk."""

from __future__ import annotations

import pytest

from dew.commandline.exits import EXIT_BAD_INPUT, EXIT_REFUSED
from tests.conftest import cli_env, dew, tree
from tests.training.conftest import TINY, fast_env

pytestmark = pytest.mark.slow

CASES = [
    # (overrides, what the message must say)
    (
        ["trainer.nope=1"],
        "trainer.nope: unknown field of trainer (TrainerConfig); its fields are name, checkpoint_dir, keep",
    ),
    (["trainer.batch_size=many"], "trainer.batch_size"),
    (["model=resnet"], "model=resnet: no such option in group model; the options are dit_b2, dit_l2, dit_s2"),
    (
        ["optim.optimizer=sgd"],
        "optim.optimizer: expected one of 'adam', 'adamw', 'lamb', 'muon', 'muonclip', found str 'sgd'",
    ),
    (["+model.nope=1"], "model.nope: unknown field of ModelConfig"),
    (["+trainer.mesh.pipeline=2"], "trainer.mesh.pipeline: unknown field of MeshSpec"),
    (["trainer.eval_every=weekly"], "trainer.eval_every: expected int or one of 'epoch' or null, found str 'weekly'"),
    (["model.config={depht: 3}"], "architecture 'simple_dit' takes no field 'depht'"),
    (["trainer.steps=10", "trainer.epochs=2"], "set exactly one"),
    (["trainer.name=../outside", "trainer.steps=2"], "trainer.name='../outside'"),
    (["model.config={num_classes: 7}", "trainer.steps=2"], "model.config.num_classes=7 conflicts with the data"),
    (["trainer.steps=2", "trainer.batch_size=30", "trainer.accumulation=4"], "trainer.batch_size=30 does not divide"),
    (["data=token_windows", "data.path=/nonexistent/tokens.bin", "trainer.steps=2"], "/nonexistent/tokens.bin"),
    (
        ["data=token_windows", "trainer.steps=2"],
        "data.path is empty: give a token file or a glob over shards; make one from text files with: "
        "dew-prepare --out data/tiny corpus/*.txt (then data.path=data/tiny/train.bin)",
    ),
    (
        ["model.dtype=bfloat16", "model.config={dtype: float32}", "trainer.steps=2"],
        "model.config.dtype='float32' disagrees with model.dtype='bfloat16'",
    ),
]


# Each must be refused by dew itself, with EXIT_BAD_INPUT, before a run directory exists.
DEW_CASES = [
    (["optim.learning_rate=nan", "trainer.steps=2"], "optim.learning_rate: expected a finite float, found float nan"),
    (["optim.learning_rate=inf", "trainer.steps=2"], "optim.learning_rate: expected a finite float, found float inf"),
    (["optim.clip_grads=nan", "trainer.steps=2"], "optim.clip_grads: expected a finite float, found float nan"),
    (["optim.weight_decay=-inf", "trainer.steps=2"], "optim.weight_decay: expected a finite float, found float -inf"),
    (["trainer.steps=99999999999999999999"], "trainer.steps=99999999999999999999 exceeds 2147483647"),
    (
        ["trainer.steps=2", "model.attention_impl=cudnn"],
        "model.attention_impl='cudnn' cannot run: the backend is 'cpu'",
    ),
    (
        ["trainer.steps=2", "trainer.xla_flags=--bogus"],
        # The tests' commands compile unoptimised (tests/conftest.py), through XLA_FLAGS: the message names them.
        f"trainer.xla_flags='--bogus' (with XLA_FLAGS={cli_env()['XLA_FLAGS']!r} from the environment): "
        "XLA does not know the flag --bogus",
    ),
    (["model.config={depth: "], "model.config: cannot parse the value '{depth: '"),
    (
        ["trainer.mesh.nope=1"],
        "trainer.mesh.nope: unknown field of trainer.mesh (MeshSpec); its fields are data, fsdp, tensor",
    ),
]
CASES += DEW_CASES


@pytest.mark.parametrize("overrides, message", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_fails_cleanly(workdir, overrides, message):
    result = dew(*overrides, "trainer.checkpoint_dir=ck", cwd=workdir, timeout=300)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert tree(workdir) == [], "a bad input left files behind"
    if (overrides, message) in DEW_CASES:
        assert result.returncode == EXIT_BAD_INPUT and result.stderr.startswith("dew-train: error: "), result.stderr


def test_an_unwritable_checkpoint_dir_is_named(workdir):
    result = dew("trainer.steps=2", "trainer.checkpoint_dir=/proc/x", cwd=workdir, timeout=300)
    assert result.returncode == EXIT_BAD_INPUT
    assert "trainer.checkpoint_dir='/proc/x': the run directory /proc/x/" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and tree(workdir) == []


def test_debug_switches_show_the_traceback(workdir):
    for switch in ("HYDRA_FULL_ERROR", "DEW_DEBUG"):
        result = dew("optim.learning_rate=nan", "trainer.checkpoint_dir=ck", cwd=workdir, env=cli_env(**{switch: "1"}))
        assert result.returncode != 0 and "Traceback" in result.stderr, result.stderr
        assert "optim.learning_rate: expected a finite float" in result.stderr and tree(workdir) == []


def test_a_run_record_that_is_not_utf8_is_named(workdir):
    run = workdir / "ck" / "digits"
    run.mkdir(parents=True)
    (run / "run.json").write_bytes(b"\xff\xfe{\x00}")
    before = tree(workdir)
    result = dew("trainer.steps=2", "trainer.name=digits", "trainer.checkpoint_dir=ck", cwd=workdir, timeout=300)
    assert result.returncode == EXIT_REFUSED, result.stderr
    assert f"{run / 'run.json'}: unreadable run record" in result.stderr and "Traceback" not in result.stderr
    sample = dew(str(run), cwd=workdir, script="dew.cli.sample")
    assert sample.returncode == 2 and f"{run / 'run.json'}: not a JSON run record" in sample.stderr, sample.stderr
    assert tree(workdir) == before


def test_a_changed_config_is_refused_and_nothing_changes(workdir):
    # The suite's tiny digits run (TINY: width 32, no end samples; programs the trainer's tests put in
    # the suite's compilation cache), not the preset's width with end samples: the refusal reads only
    # the run's record (8.2-8.7 -> 7.2-7.9 CPU-s standalone on a fresh cache, more in the suite).
    args = [
        *TINY,
        "trainer.steps=2",
        "trainer.eval_every=null",
        "trainer.checkpoint_every=null",
        "trainer.checkpoint_dir=ck",
    ]
    first = dew(*args, cwd=workdir, env=fast_env())
    assert first.returncode == 0, first.stderr
    before = {p: (workdir / p).stat().st_mtime_ns for p in tree(workdir) if (workdir / p).is_file()}
    second = dew(*args, "optim.learning_rate=0.5", cwd=workdir)
    assert second.returncode != 0
    assert "optim.learning_rate: 0.001 -> 0.5" in second.stderr and "Traceback" not in second.stderr
    assert second.returncode == EXIT_REFUSED
    after = {p: (workdir / p).stat().st_mtime_ns for p in tree(workdir) if (workdir / p).is_file()}
    assert after == before


def test_no_network_and_no_files_says_what_to_download(workdir, tmp_path):
    result = dew(
        "data=oxford_flowers102",
        f"data.cache_dir={tmp_path / 'cache'}",
        "trainer.steps=2",
        "trainer.checkpoint_dir=ck",
        cwd=workdir,
        timeout=300,
    )
    assert result.returncode != 0
    assert "Without network, download 102flowers.tgz, imagelabels.mat and setid.mat" in result.stderr
    assert "Traceback" not in result.stderr
    assert tree(workdir) == []
