"""Bad input to dew-train: one clear message, a non-zero exit, no traceback, nothing on disk."""

from __future__ import annotations

import pytest

from tests.conftest import dew, tree

CASES = [
    # (overrides, what the message must say)
    (["trainer.nope=1"], "trainer.nope"),
    (["trainer.batch_size=many"], "trainer.batch_size"),
    (["model=resnet"], "model/resnet"),
    (["optim.optimizer=sgd"], "optim.optimizer: expected one of 'adam', 'adamw', 'lamb', 'muon', 'muonclip', found str 'sgd'"),
    (["+model.nope=1"], "model.nope: unknown field of ModelConfig"),
    (["+trainer.mesh.pipeline=2"], "trainer.mesh.pipeline: unknown field of MeshSpec"),
    (["trainer.eval_every=weekly"], "trainer.eval_every: expected int or one of 'epoch' or null, found str 'weekly'"),
    (["model.config={depht: 3}"], "architecture 'simple_dit' takes no field 'depht'"),
    (["trainer.steps=10", "trainer.epochs=2"], "set exactly one"),
    (["trainer.name=../outside", "trainer.steps=2"], "trainer.name='../outside'"),
    (["model.config={num_classes: 7}", "trainer.steps=2"], "model.config.num_classes=7 conflicts with the data"),
    (["trainer.steps=2", "trainer.batch_size=30", "trainer.accumulation=4"], "trainer.batch_size=30 does not divide"),
    (["data=token_windows", "data.path=/nonexistent/tokens.bin", "trainer.steps=2"], "/nonexistent/tokens.bin"),
    (["data=token_windows", "trainer.steps=2"],
     "data.path is empty: give a token file or a glob over shards; make one from text files with: "
     "dew-prepare --out data/tiny corpus/*.txt (then data.path=data/tiny/train.bin)"),
    (["model.dtype=bfloat16", "model.config={dtype: float32}", "trainer.steps=2"],
     "model.config.dtype='float32' disagrees with model.dtype='bfloat16'"),
]


@pytest.mark.parametrize("overrides, message", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_fails_cleanly(workdir, overrides, message):
    result = dew(*overrides, "trainer.checkpoint_dir=ck", cwd=workdir, timeout=300)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert tree(workdir) == [], "a bad input left files behind"


def test_a_changed_config_is_refused_and_nothing_changes(workdir):
    first = dew("experiment=digits", "trainer.steps=2", "trainer.eval_every=null", "trainer.checkpoint_every=null",
                "optim.schedule.warmup_steps=1", "trainer.checkpoint_dir=ck", "flow_matching.samples_per_class=1",
                "flow_matching.sample_steps=2", "model.config.depth=1", cwd=workdir)
    assert first.returncode == 0, first.stderr
    before = {p: (workdir / p).stat().st_mtime_ns for p in tree(workdir) if (workdir / p).is_file()}
    second = dew("experiment=digits", "trainer.steps=2", "trainer.eval_every=null", "trainer.checkpoint_every=null",
                 "optim.schedule.warmup_steps=1", "trainer.checkpoint_dir=ck", "flow_matching.samples_per_class=1",
                 "flow_matching.sample_steps=2", "model.config.depth=1", "optim.learning_rate=0.5", cwd=workdir)
    assert second.returncode != 0
    assert "optim.learning_rate: 0.001 -> 0.5" in second.stderr and "Traceback" not in second.stderr
    after = {p: (workdir / p).stat().st_mtime_ns for p in tree(workdir) if (workdir / p).is_file()}
    assert after == before


def test_no_network_and_no_files_says_what_to_download(workdir, tmp_path):
    result = dew("data=oxford_flowers102", f"data.cache_dir={tmp_path / 'cache'}", "trainer.steps=2",
                 "trainer.checkpoint_dir=ck", cwd=workdir, timeout=300)
    assert result.returncode != 0
    assert "Without network, download 102flowers.tgz, imagelabels.mat and setid.mat" in result.stderr
    assert "Traceback" not in result.stderr
    assert tree(workdir) == []
