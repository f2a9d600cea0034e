"""dew-eval: a saved step evaluated again gives the eval loss the trainer recorded in its journal at that
step (a digits run, a BPE token run; one process and two), bits per byte from the decoded targets, a
Hugging Face Llama directory dew-export wrote gives the loss a NumPy Llama gives on the same windows,
and bad input ends in one line with nothing written."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dew.launching.pool import free_ports
from tests import warm
from tests.conftest import SUITE_CACHE, tree
from tests.training.conftest import fast_env, journal, losses

pytestmark = pytest.mark.slow

STEPS = ["trainer.steps=4", "trainer.eval_every=2", "trainer.checkpoint_every=2", "trainer.log_every=1"]
SEQ = 16
CACHE = f"trainer.compilation_cache_dir={SUITE_CACHE}"
PADDED = 320
"""The token run's embedding rows: padded past its BPE's 300 ids, as Qwen2.5's are."""


def _lm_overrides(data: Path) -> list[str]:
    return [
        "data=token_windows",
        f"data.path={data / 'train.bin'}",
        f"data.val_path={data / 'val.bin'}",
        f"data.seq_len={SEQ}",
        f"model.config={{hidden_size: 32, depth: 1, num_heads: 4, num_kv_heads: 2, vocab_size: {PADDED}}}",
        "model.dtype=float32",
        "trainer.batch_size=8",
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A tiny digits run and a tiny next-token run on BPE tokens (its vocabulary padded: ``PADDED``
    rows for 300 ids), each with steps 2 and 4 saved and evaluated, trained in this process
    (compiling as the CLI subprocesses do: unoptimised)."""
    from dew.build import build_run
    from dew.data.prepare import prepare
    from dew.objectives.metrics import builtin_metrics
    from tests.training.conftest import compose
    from tests.training.mesh_runs import compose as compose_bare

    root = tmp_path_factory.mktemp("eval")
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while"]
    words += ["na\u00efve", "caf\u00e9s", "serve", "cr\u00e8me", "br\u00fbl\u00e9e"]  # several bytes a letter
    rng = np.random.default_rng(0)
    for name, n in (("train", 3000), ("val", 300)):
        (root / f"{name}.txt").write_text(" ".join(rng.choice(words, n)) + "\n")
    prepare([str(root / "train.txt")], str(root / "bpe"), tokenizer="bpe", vocab_size=300, val=[str(root / "val.txt")])
    prepare([str(root / "train.txt")], str(root / "bytes"), val=[str(root / "val.txt")])
    ck = f"trainer.checkpoint_dir={root / 'ck'}"
    recipe, objective, dataset = build_run(compose(ck, *STEPS))
    recipe.train(objective, dataset, name="digits", metrics=builtin_metrics(objective))
    recipe, objective, dataset = build_run(compose_bare(*_lm_overrides(root / "bpe"), ck, *STEPS, CACHE))
    recipe.train(objective, dataset, name="lm", metrics=builtin_metrics(objective))  # as dew-train does
    return {"root": root, "digits": root / "ck" / "digits", "lm": root / "ck" / "lm"}


def _eval(*args: str) -> dict:
    """dew-eval in this process: the JSON it wrote."""
    from dew.cli.eval import parse_args
    from dew.inference import evaluating

    _, written = evaluating.run(parse_args(list(args)))
    assert written is not None
    return json.loads(Path(written).read_text())


def _recorded(run: Path, step: int, key: str = "eval/loss") -> float:
    return losses(journal(run.parent.parent, run.name), key)[step]


def _bits_per_byte(root: Path, loss: float) -> float:
    """The loss in bits over the UTF-8 bytes of the held-out windows' decoded targets, counted here."""
    from dew.data.token_files import open_tokens
    from dew.data.tokenizer import BPETokenizer

    tokens = open_tokens(str(root / "bpe" / "val.bin"))
    tok = BPETokenizer.from_file(str(root / "bpe" / "tokenizer.json"))
    windows = [tokens[i * SEQ + 1 : i * SEQ + SEQ + 1] for i in range((len(tokens) - 1) // SEQ)]
    nbytes = sum(len(tok.decode([int(t) for t in w]).encode("utf-8")) for w in windows)
    return loss * len(windows) * SEQ / math.log(2) / nbytes


def test_a_saved_step_gives_the_loss_the_journal_recorded(runs):
    before = {k: tree(runs[k]) for k in ("digits", "lm")}
    for step in (2, 4):
        digits = _eval(str(runs["digits"]), "--step", str(step))
        assert abs(digits["metrics"]["eval/loss"] - _recorded(runs["digits"], step)) < 1e-6
        assert digits["step"] == step and digits["ema"] is False and digits["data"]["name"] == "digits"
    lm = _eval(str(runs["lm"]), "--step", "2")
    values = lm["metrics"]
    for key in ("eval/loss", "eval/accuracy", "eval/perplexity", "eval/bits_per_token"):
        assert abs(values[key] - _recorded(runs["lm"], 2, key)) < 1e-6 * max(1.0, values[key]), key
    assert values["eval/bits_per_byte"] == pytest.approx(_bits_per_byte(runs["root"], values["eval/loss"]), rel=1e-6)
    assert 1.0 < values["eval/bytes_per_token"] < 8.0  # a BPE token of these words: a few bytes
    # The EMA of a digits run (flow matching keeps one) is another model: another loss.
    ema = _eval(str(runs["digits"]), "--step", "4", "--ema")
    assert ema["ema"] is True and ema["metrics"]["eval/loss"] != _recorded(runs["digits"], 4)
    # Only the results were written, under eval/ (step2-digits.json, ...), whole.
    for k in ("digits", "lm"):
        after = tree(runs[k])
        assert [p for p in after if p not in before[k]] == sorted(
            ["eval", *(f"eval/{p.name}" for p in (runs[k] / "eval").iterdir())]
        )
        assert not [p for p in after if ".tmp-" in p]
    assert {p.name for p in (runs["digits"] / "eval").iterdir()} == {
        "step2-digits.json",
        "step4-digits.json",
        "step4-ema-digits.json",
    }


def test_another_file_as_the_held_out_split(runs):
    # The byte-level tokens of the same text: another vocabulary than the run's, refused in one line.
    code, err = _main(str(runs["lm"]), f"data.val_path={runs['root'] / 'bytes' / 'val.bin'}")
    assert code == 2 and "vocab" in err and len(err.strip().splitlines()) == 1, err
    # The training file as the held-out split: another loss, written under its own name.
    own = _eval(str(runs["lm"]), "--step", "4")
    other = _eval(str(runs["lm"]), "--step", "4", f"data.val_path={runs['root'] / 'bpe' / 'train.bin'}")
    assert other["metrics"]["eval/loss"] != own["metrics"]["eval/loss"]
    assert len(list((runs["lm"] / "eval").glob("step4-token_windows*.json"))) == 2


def test_data_of_another_tokenizer_is_refused_in_one_line(runs):
    """The token run's 320 rows take data of any id below 320 by size: another BPE of 300 ids
    trained on other text, and the bytes' 257, are refused by what their ids mean
    (``dew.data.tokenizer_identity``), by dew-eval and by dew-sample, in one line that names both
    tokenizers and how to encode with the run's, with nothing written. Other text encoded with the
    run's tokenizer as that line says, files that record no tokenizer and a run that recorded none
    (as older ones) are taken, as before."""
    import shutil

    from dew.cli import sample
    from dew.commandline.configs import conf_dir
    from dew.data.prepare import prepare
    from dew.data.tokenizer import saved_record
    from dew.data.tokenizer_identity import identity
    from dew.inference import evaluating, restore
    from dew.inference.composing import target
    from tests.data.test_tokenizer_identity import corpus

    root, run = runs["root"], runs["lm"]
    kept = run / "tokenizer"
    text = [str(corpus(root / "other.txt", "abcdefgh", 0))]
    prepare(text, str(root / "other"), tokenizer="bpe", vocab_size=300, val=text)
    prepare(text, str(root / "reused"), tokenizer=str(kept), val=text)  # the refusal's advice

    def data(name: str) -> list[str]:
        return [f"data.path={root / name / 'train.bin'}", f"data.val_path={root / name / 'val.bin'}"]

    trained_on = identity(saved_record(str(kept)))
    other = identity({"kind": "bpe", "file": str(root / "other" / "tokenizer.json")})
    assert (other.vocab, trained_on.vocab) == (300, 300) and other != trained_on
    before = tree(root)
    code, err = _main(str(run), *data("other"))
    assert (code, err) == (
        2,
        f"dew-eval: error: data.path='{root / 'other' / 'train.bin'}': tokenized by {other} but run {run} was "
        f"trained on {trained_on}; give data encoded with the model's tokenizer (dew-prepare --tokenizer {kept} "
        "--out DIR FILES...)\n",
    )
    code, err = _main(str(run), *data("bytes"))
    assert code == 2 and "tokenized by bytes (vocab 257) but run" in err and len(err.splitlines()) == 1, err
    code, err = _main(str(run), f"data.val_path={root / 'other' / 'val.bin'}")  # two sidecars, two tokenizers
    assert code == 2 and "sidecars name different tokenizers" in err and str(other) in err, err
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as stop:
        sample.main([str(run), *data("other")])
    assert stop.value.code == 2 and stderr.getvalue().startswith(
        f"dew-sample: error: data.path='{root / 'other' / 'train.bin'}': "
    )
    assert (
        f"but run {run} was trained on {trained_on}" in stderr.getvalue() and len(stderr.getvalue().splitlines()) == 1
    )
    assert tree(root) == before
    # Taken: the run's tokenizer on other text (dew-eval's rebuild, dew-sample's restore); a raw file
    # that records no tokenizer, read by its size; a run that recorded none.
    _, _, dataset = evaluating.rebuild(target(str(run), data("reused"), conf_dir()))
    assert identity(dataset.tokenizer) == trained_on
    assert restore.restore(str(run), overrides=data("reused")).step == 4
    (root / "raw").mkdir()
    for name in ("train.bin", "val.bin"):
        shutil.copy(root / "other" / name, root / "raw" / name)
    _, _, dataset = evaluating.rebuild(target(str(run), [*data("raw"), "data.vocab_size=300"], conf_dir()))
    assert dataset.tokenizer is None
    (root / "older").mkdir()
    shutil.copy(run / "run.json", root / "older" / "run.json")
    evaluating.rebuild(target(str(root / "older"), data("other"), conf_dir()))


def _main(*args: str) -> tuple[int, str]:
    """dew-eval's main in this process: (exit status, stderr)."""
    from dew.cli import eval as dew_eval

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            dew_eval.main(list(args))
        except SystemExit as stop:
            return int(stop.code or 0), err.getvalue()
    return 0, err.getvalue()


@pytest.mark.parametrize(
    "args, says",
    [
        (["{root}/nope"], "no such run directory"),
        (["{digits}", "--step", "3"], "--step 3: "),
        (["{digits}", "experiment=digits"], "presets a whole run"),
        (["{digits}", "trainer.nope=1"], "trainer.nope: unknown field"),
        (["{digits}", "data.eval_fraction=2"], "data.eval_fraction"),
        (["{lm}", "--ema"], "kept no EMA"),
        (["{digits}", "trainer.mesh.fsdp=3"], "trainer.mesh="),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(runs, args, says):
    before = tree(runs["root"])
    code, err = _main(*(a.format(**runs) for a in args))
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert tree(runs["root"]) == before


def test_two_processes_give_the_journal_loss(runs, tmp_path):
    """Two dew-eval processes in one JAX pool (one CPU device each), as submitit's local executor
    starts a job's tasks: the batch split over both, and the token run's parameters too (fsdp: each
    process holds half of every matrix); the loss the one-process training recorded."""
    fsdp = ["trainer.mesh.data=1", "trainer.mesh.fsdp=2", "trainer.layout.min_shard_size=0"]
    for name, step, layout in (("digits", 4, []), ("lm", 4, fsdp)):
        out = runs["root"] / f"{name}-2p.json"
        (port,) = free_ports(1).values()
        args = [str(runs[name]), "--step", str(step), "--out", str(out), *layout]
        logs = [tmp_path / f"{name}-2p-{i}.out" for i in range(2)]
        procs = [started(args, tmp_path, rank_env(port, i), log) for i, log in enumerate(logs)]
        deadline = time.monotonic() + 300
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            finally:
                if p.poll() is None:
                    os.kill(p.pid, 9)  # JAX's pool catches SIGTERM
                    p.wait()
        outs = [log.read_text() for log in logs]
        assert [p.returncode for p in procs] == [0, 0], outs
        result = json.loads(out.read_text())
        assert result["processes"] == 2 and result["devices"] == 2
        assert abs(result["metrics"]["eval/loss"] - _recorded(runs[name], step)) < 1e-6
        assert "eval/loss" in outs[0] and "eval/loss" not in outs[1]  # process 0 reports


def rank_env(port: int, rank: int) -> dict[str, str]:
    """Rank ``rank``'s environment in a pool of 2 on ``port``, as submitit's local executor sets it."""
    return fast_env(
        JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
        SUBMITIT_EXECUTOR="local",
        SUBMITIT_LOCAL_JOB_ID=str(port),
        SUBMITIT_LOCAL_NTASKS="2",
        SUBMITIT_LOCAL_GLOBALID=str(rank),
        SUBMITIT_LOCAL_LOCALID=str(rank),
        SUBMITIT_LOCAL_NODEID="0",
        SUBMITIT_LOCAL_JOB_NUM_NODES="1",
    )


def started(args: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen | warm.Started:
    """``dew-eval args``, its output written to ``log``: forked from the suite's warm interpreter
    (tests/warm.py), cold where it cannot be."""
    if (proc := warm.start("dew.cli.eval", args, cwd, env, log)) is not None:
        return proc
    return subprocess.Popen(
        [sys.executable, "-m", "dew.cli.eval", *args], cwd=cwd, env=env, stdout=open(log, "a"), stderr=subprocess.STDOUT
    )


def test_a_hugging_face_directory_gives_a_numpy_llamas_loss(runs):
    from dew.cli import export
    from dew.data.token_files import open_tokens
    from dew.inference import exporting
    from tests.training.checkpointing.test_hf_llama import llama_logits

    hf = runs["root"] / "lm-hf"
    exporting.run(export.parse_args([str(runs["lm"]), "--step", "4", "--to", str(hf)]))
    data = runs["root"] / "bpe"
    result = _eval(
        str(hf),
        "data=token_windows",
        f"data.path={data / 'train.bin'}",
        f"data.val_path={data / 'val.bin'}",
        f"data.seq_len={SEQ}",
        "model.dtype=float32",
        "trainer.batch_size=8",
    )
    tokens = np.asarray(open_tokens(str(data / "val.bin")), np.int64)
    windows = np.stack([tokens[i * SEQ : i * SEQ + SEQ + 1] for i in range((len(tokens) - 1) // SEQ)])
    logits = llama_logits(hf, windows[:, :-1])
    logits = logits - logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    reference = -np.take_along_axis(logp, windows[:, 1:, None], -1).mean()
    assert abs(result["metrics"]["eval/loss"] - reference) < 1e-4, (result["metrics"]["eval/loss"], reference)
    assert result["kind"] == "hf" and result["step"] is None and (hf / "eval").is_dir()
    # The run's own step 4 is the same model: the same loss.
    assert abs(result["metrics"]["eval/loss"] - _recorded(runs["lm"], 4)) < 1e-4
    # Bytes fit its 320 rows by size, but the directory's tokenizer.json is the run's BPE: refused.
    code, err = _main(
        str(hf),
        "data=token_windows",
        f"data.path={runs['root'] / 'bytes' / 'train.bin'}",
        f"data.val_path={runs['root'] / 'bytes' / 'val.bin'}",
        f"data.seq_len={SEQ}",
    )
    assert code == 2 and "tokenized by bytes (vocab 257) but the model in" in err, err
    assert "trained on pretrained (vocab 300, digest " in err and f"dew-prepare --tokenizer {hf} " in err, err


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
"""Llama, Qwen2, Qwen3 and Mistral directories transformers made, with its per-token losses over fixed windows
(``tests/fixtures/hf/make.py``)."""


EVALUATED = ("t5-f32", "llama3", "sharded", "tied", "qwen2", "qwen3", "mistral")
"""The fixtures evaluated here, one of each form (transformers 5's spelling, Llama 3's RoPE scaling,
float16 shards behind an index, a tied head) and each family beside Llama (Qwen2, Qwen3, Mistral):
each compiles a model of its own, and tests/training/checkpointing/test_hf_fixtures.py checks every
fixture's losses through the reader."""


def _fixtures() -> list[str]:
    return [name for name in EVALUATED if (FIXTURES / name / "reference.json").is_file()]


@pytest.mark.parametrize("name", _fixtures())
def test_a_transformers_fixture_gives_transformers_loss(name, tmp_path):
    """Each window of the fixture as its own token file (a window never crosses files): dew-eval's
    loss over them is the mean of transformers' per-token losses. The data's vocabulary is the
    tokenizer's where the directory has one: 300 ids for qwen2's 320 embedding rows (padded, as
    Qwen2.5's are), whose logits and loss are over every row, as transformers'."""
    from dew.data.tokenizer import PretrainedTokenizer

    directory = FIXTURES / name
    ref = json.loads((directory / "reference.json").read_text())
    windows = np.asarray(ref["windows"])
    for i, window in enumerate(windows):
        np.save(tmp_path / f"w{i}.npy", window.astype(np.uint16))
    vocab = json.loads((directory / "config.json").read_text())["vocab_size"]
    if (directory / "tokenizer.json").is_file():
        vocab = PretrainedTokenizer.from_path(str(directory)).vocab_size
    files = f"{tmp_path}/w*.npy"
    out = tmp_path / "result.json"
    result = _eval(
        str(directory),
        "data=token_windows",
        f"data.path={files}",
        f"data.val_path={files}",
        f"data.seq_len={windows.shape[1] - 1}",
        f"data.vocab_size={vocab}",
        "model.dtype=float32",
        "trainer.batch_size=4",
        "--out",
        str(out),
    )
    assert abs(result["metrics"]["eval/loss"] - ref["mean_loss"]) < 1e-4, (result["metrics"], ref["mean_loss"])
    assert not (directory / "eval").exists()  # --out: nothing written into the fixture
