"""Downstream tasks (``trainer.evals``): dew scores a model dew-export wrote as lm-evaluation-harness
0.4.13 scores it (``tests/fixtures/lm_eval``: three local tasks, the harness's per-example
log-likelihoods to 1e-4, its accuracies exactly, its requests string for string); the tasks scored
every N steps of a tiny run land in the journal and the best checkpoint and early stopping watch
them; bad task files are refused before anything is written, naming the field and the example."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dew.contract.evals import Evals, EvalTask

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "lm_eval"
MODEL = FIXTURE / "model"

SPECS = {
    "hellaswag_like": dict(context_field="ctx", choices_field="endings", gold_field="label"),
    "arc_like": dict(context_field="question", choices_field="choices", gold_field="answer"),
    "lambada_like": dict(kind="loglikelihood", context_field="text", continuation_field="target"),
}
"""The fixture's tasks as dew's ``trainer.evals.tasks`` names them (make.py's TASKS)."""


def _specs() -> list[EvalTask]:
    return [EvalTask(name, str(FIXTURE / "tasks" / f"{name}.jsonl"), **fields) for name, fields in SPECS.items()]


def _exported():
    """(graph, parameters, rest, seq_len) of the fixture's export, read as ``trainer.init_from`` reads it."""
    import jax
    from flax import nnx

    from dew.contract.models import architecture, of
    from dew.training.checkpointing import hf_llama, hf_weights, warmstart

    config = json.loads((MODEL / "config.json").read_text())
    seq_len = config["max_position_embeddings"]
    values = {
        **hf_llama.model_config(str(MODEL)),
        "vocab_size": config["vocab_size"],
        "seq_len": seq_len,
        "dtype": "float32",
        "param_dtype": "float32",
    }
    fields = of("transformer", values).fields
    model = nnx.eval_shape(lambda: architecture("transformer")(fields).build(nnx.Rngs(params=0)))
    graph, params, rest = nnx.split(model, nnx.Param, ...)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {p: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=device) for p, v in nnx.to_flat_state(params)}
    nnx.replace_by_pure_dict(params, warmstart._nested(hf_weights.read(fields, str(MODEL), target)))
    return graph, params, rest, seq_len


@pytest.mark.slow
def test_per_example_loglikelihoods_and_accuracies_are_the_harness_s():
    import jax

    from dew.contract.config import TrainerConfig
    from dew.data import eval_tasks
    from dew.data.tokenizer import BPETokenizer, PretrainedTokenizer
    from dew.training import task_evals
    from dew.training.assembly import mesh_of

    reference = json.loads((FIXTURE / "reference.json").read_text())["tasks"]
    graph, params, rest, seq_len = _exported()
    encoding = eval_tasks.HarnessEncoding(PretrainedTokenizer.from_path(str(MODEL)))
    tasks = eval_tasks.load_tasks(_specs(), encoding, seq_len)
    # The data's own tokenizer record (a BPE: dew-prepare's) encodes every request alike.
    as_bpe = eval_tasks.HarnessEncoding(BPETokenizer.from_file(str(MODEL / "tokenizer.json")))
    assert [t.requests() for t in eval_tasks.load_tasks(_specs(), as_bpe, seq_len)] == [t.requests() for t in tasks]
    t = TrainerConfig()
    mesh = mesh_of(t)
    shardings = jax.tree.map(lambda x: x.sharding, params)
    evaluator = task_evals.evaluator(tasks, 8, seq_len, graph, rest, t, mesh, shardings)
    assert {b.inputs.shape for b in evaluator.batches} == {(8, 16), (8, 32)}  # two buckets, whatever the rows
    scored = evaluator.examples(params)
    longest = 0
    for task in tasks:
        ref = reference[task.spec.name]
        assert len(ref["examples"]) == len(task.examples) == len(scored[task.spec.name])
        for example, theirs, ours in zip(task.examples, ref["examples"], scored[task.spec.name], strict=True):
            assert [list(r) for r in example.texts] == theirs["requests"]  # the strings the harness scored
            np.testing.assert_allclose(ours.loglikelihoods, theirs["loglikelihoods"], rtol=0, atol=1e-4)
            assert list(ours.greedy) == theirs["greedy"]
            if task.spec.kind == "multiple_choice":
                assert float(ours.prediction == ours.gold) == theirs["acc"]
                assert float(ours.prediction_norm == ours.gold) == theirs["acc_norm"]
            else:
                assert int(ours.greedy[0]) == theirs["acc"]
            longest = max(longest, *(len(c) + len(x) for c, x in example.requests))
        values = eval_tasks.task_values(task, scored[task.spec.name])
        theirs = {**ref["metrics"]}
        if task.spec.kind == "loglikelihood":  # dew's own: the mean the harness's perplexity is exp of
            theirs["loglikelihood"] = float(np.mean([e["loglikelihoods"][0] for e in ref["examples"]]))
        assert values == pytest.approx({k: theirs[k.rsplit("/", 1)[1]] for k in values}, rel=1e-6)
    assert longest > seq_len + 1  # some rows were cut from the left, as the harness cuts them
    _the_harness_cache_differs_where_requests_share_their_tokens(tasks, reference)


def _the_harness_cache_differs_where_requests_share_their_tokens(tasks, reference) -> None:
    """The reference is the harness with its logits cache off (each request scored on its own). With
    it on (its default), a request whose ids but the last are another's with a longer continuation
    takes that one's logits and reads its log-probabilities at the longer continuation's first
    positions instead of its last (lm-evaluation-harness 0.4.13, ``Collator.get_cache`` and the
    ``torch.gather`` after it): the fixture's lambada_like example 5 is hellaswag_like example 1's
    third choice, token for token. Every other request scores the same either way."""
    requests = [(c + t, t) for task in tasks for c, t in task.requests()]
    changed = []
    for task in tasks:
        ref = reference[task.spec.name]
        for (c, t), a, b in zip(
            [r for e in task.examples for r in e.requests],
            [x for e in ref["examples"] for x in e["loglikelihoods"]],
            [x for e in ref["cached_examples"] for x in e["loglikelihoods"]],
            strict=True,
        ):
            if abs(a - b) > 1e-4:
                changed.append(task.spec.name)
                assert any(w[:-1] == (c + t)[:-1] and len(u) > len(t) for w, u in requests)
    assert changed == ["lambada_like"]


def test_requests_are_encoded_as_the_harness_encodes_them():
    """``_encode_pair``: trailing spaces move to the continuation, a token across the boundary is
    the continuation's; an empty context is the prefix token; a continuation past seq_len is refused."""
    from dew.data import eval_tasks
    from dew.data.tokenizer import BPETokenizer, ByteTokenizer

    bpe = eval_tasks.HarnessEncoding(BPETokenizer.from_file(str(MODEL / "tokenizer.json")))
    tok = bpe.tokenizer.tokenizer
    head, tail = bpe.pair("Answer: ", "x")
    assert head == tok.encode("Answer:").ids and head + tail == tok.encode("Answer: x").ids
    whole = tok.encode("the fox").ids
    head, tail = bpe.pair("the", " fox")
    assert head + tail == whole and tail == whole[len(tok.encode("the").ids) :]
    assert bpe.pair("", "The quick") == ([tok.token_to_id("<|endoftext|>")], tok.encode("The quick").ids)
    byte = eval_tasks.HarnessEncoding(ByteTokenizer())
    assert byte.pair("ab ", "c") == ([97, 98], [32, 99])
    assert byte.pair("", "\u00e9") == ([256], [0xC3, 0xA9])
    # Rows: the last seq_len + 1 ids, the continuation's the last targets.
    inputs, targets, n = eval_tasks.row([1, 2, 3, 4, 5], [6, 7], 4)
    assert (inputs, targets, n) == ([3, 4, 5, 6], [4, 5, 6, 7], 2)
    (batch,) = eval_tasks.row_batches([([1, 2], [3]), ([5], [6, 7])], 20, 4)
    assert batch.inputs.shape == (4, 16) and batch.request.tolist() == [0, 1, -1, -1]
    assert batch.mask[0].nonzero()[0].tolist() == [1] and batch.mask[1].nonzero()[0].tolist() == [0, 1]
    assert eval_tasks.buckets(100) == [16, 32, 64, 100] and eval_tasks.buckets(16) == [16]


@pytest.mark.parametrize(
    ("line", "fields", "message"),
    [
        (
            '{"context": "a", "choices": ["b"]}',
            {},
            r"example 0 has no field 'gold' \(gold_field='gold'\); its fields: context, choices",
        ),
        (
            '{"context": "a", "choices": ["b", "c"], "gold": 2}',
            {},
            r"gold=2 must be a choice's index, 0 to 1, or its text",
        ),
        ('{"context": "a", "choices": ["b", "c"], "gold": "d"}', {}, r"gold='d' is not one of its choices"),
        ('{"context": "a", "choices": [], "gold": 0}', {}, r"choices must be a list of non-empty strings"),
        ('{"context": 3, "choices": ["b"], "gold": 0}', {}, r"context must be a string, got int 3"),
        ("[1, 2]", {}, r"line 1 is a list, not a JSON object"),
        ("{nope", {}, r"line 1 is not JSON"),
        ('{"context": "a", "choices": ["' + "b " * 40 + '"], "gold": 0}', {}, r"more than the model's seq_len=32"),
        ('{"text": "a"}', {"kind": "loglikelihood", "context_field": "text"}, r"no field 'continuation'"),
    ],
)
def test_a_bad_task_file_is_refused_naming_the_field(tmp_path, line, fields, message):
    from dew.data import eval_tasks
    from dew.data.tokenizer import ByteTokenizer

    path = tmp_path / "t.jsonl"
    path.write_text(line + "\n")
    encoding = eval_tasks.HarnessEncoding(ByteTokenizer())
    with pytest.raises(eval_tasks.TaskError, match=r"trainer\.evals\.tasks\[0\] \(t\): .*" + message):
        eval_tasks.load_tasks([EvalTask("t", str(path), **fields)], encoding, 32)
    with pytest.raises(eval_tasks.TaskError, match=r"trainer\.evals\.tasks\[0\] \(t\)\.path='/nowhere' does not exist"):
        eval_tasks.load_tasks([EvalTask("t", "/nowhere")], encoding, 32)


def test_the_config_is_checked_naming_the_field():
    for kwargs, message in [
        ({"tasks": ()}, r"trainer\.evals\.tasks is empty"),
        ({"tasks": (EvalTask("a", "x"), EvalTask("a", "y"))}, r"names \['a', 'a'\] repeat"),
        ({"tasks": (EvalTask("a", "x"),), "every": 0}, r"trainer\.evals\.every=0 must be >= 1"),
        ({"tasks": (EvalTask("a", "x"),), "best": "eval/a/perplexity"}, r"eval/a/acc, eval/a/acc_norm"),
    ]:
        with pytest.raises(ValueError, match=message):
            Evals(**kwargs)
    with pytest.raises(ValueError, match=r"name='a/b' must be letters"):
        EvalTask("a/b", "x")
    assert Evals((EvalTask("a", "x", kind="loglikelihood"),)).values() == {
        "eval/a/acc": True,
        "eval/a/loglikelihood": True,
        "eval/a/perplexity": False,
    }


# ------------------------------------------------------------------------------ during training

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog"]


def task_data(root: Path) -> str:
    """Byte tokens of random words in ``root/bytes`` and two tasks beside (``mc``, ``ll``): the
    tasks as ``trainer.evals.tasks`` lists them."""
    from dew.data.prepare import prepare

    if not (root / "bytes").exists():
        rng = np.random.default_rng(0)
        for name, n in (("train", 2000), ("val", 200)):
            (root / f"{name}.txt").write_text(" ".join(rng.choice(WORDS, n)) + "\n")
        prepare([str(root / "train.txt")], str(root / "bytes"), val=[str(root / "val.txt")])
        mc = [{"context": "the quick brown", "choices": [" fox", " dog", " over a"], "gold": i % 3} for i in range(3)]
        (root / "mc.jsonl").write_text("".join(json.dumps(e) + "\n" for e in mc))
        ll = [{"context": "the lazy", "continuation": " dog"}, {"context": "jumps", "continuation": " over the fox"}]
        (root / "ll.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ll))
    return f"{{name: mc, path: {root / 'mc.jsonl'}}}, {{name: ll, path: {root / 'll.jsonl'}, kind: loglikelihood}}"


def _lm(root: Path, *overrides: str):
    """A tiny next-token run on byte tokens with two tasks (``mc``, ``ll``), composed as dew-train does."""
    from tests.conftest import SUITE_CACHE
    from tests.training.mesh_runs import compose

    tasks = task_data(root)
    return compose(
        "data=token_windows",
        f"data.path={root / 'bytes' / 'train.bin'}",
        f"data.val_path={root / 'bytes' / 'val.bin'}",
        "data.seq_len=16",
        "model.config={hidden_size: 32, depth: 1, num_heads: 4}",
        "model.dtype=float32",
        "trainer.batch_size=8",
        "trainer.log_every=1",
        f"trainer.checkpoint_dir={root / 'ck'}",
        f"trainer.compilation_cache_dir={SUITE_CACHE}",
        f"trainer.evals={{tasks: [{tasks}], every: 2, batch_size: 4, best: eval/ll/loglikelihood}}",
        *overrides,
    )


@pytest.mark.slow
def test_tasks_every_n_steps_land_in_the_journal_choose_the_best_and_stop_the_run(tmp_path):
    from dew.build import build_run
    from dew.cli.eval import parse_args
    from dew.inference import evaluating
    from tests.training.conftest import journal

    recipe, objective, dataset = build_run(
        _lm(tmp_path, "trainer.steps=6", "trainer.eval_every=3", "trainer.checkpoint_every=2", "trainer.keep=5")
    )
    recipe.train(objective, dataset, name="run")
    records = journal(tmp_path, "run")
    scored = {r["step"]: r for r in records if "eval/mc/acc" in r and "event" not in r}
    held_out = {r["step"] for r in records if "eval/loss" in r and "event" not in r}
    assert sorted(scored) == [2, 4, 6] and sorted(held_out) == [3, 6]  # every 2 steps; the held-out every 3
    assert set(scored[2]) >= {"eval/mc/acc", "eval/mc/acc_norm", "eval/ll/acc", "eval/ll/perplexity"}
    events = [r for r in records if r.get("event") == "eval"]
    assert [e["step"] for e in events] == [2, 3, 4, 6]  # one evaluation event a step, both kinds at step 6
    # The best checkpoint is the one of the highest eval/ll/loglikelihood (trainer.evals.best).
    (end,) = [r for r in records if r.get("event") == "end"]
    lls = {s: r["eval/ll/loglikelihood"] for s, r in scored.items()}
    assert end["best_step"] == max(lls, key=lls.__getitem__)
    # dew-sample's "best" checkpoint is that one too (higher is better for a log-likelihood).
    from dew.inference import restore

    checkpoints = restore.run_checkpoints(recipe, objective, str(tmp_path / "ck" / "run"))
    try:
        assert checkpoints.best_step() == max(lls, key=lls.__getitem__)
    finally:
        checkpoints.close()
    # dew-eval scores the saved step as the loop did.
    _, written = evaluating.run(parse_args([str(tmp_path / "ck" / "run"), "--step", "4", "--tasks-only"]))
    again = json.loads(Path(written).read_text())
    assert Path(written).name == "step4-tasks.json" and "eval/loss" not in again["metrics"]
    for key, value in again["metrics"].items():
        assert value == pytest.approx(scored[4][key], rel=1e-5, abs=1e-6), key
    assert [len(e["loglikelihoods"]) for e in again["tasks"]["mc"]] == [3, 3, 3]

    # Early stopping on a task's value: no gain of 1000 nats after the first scoring stops the run.
    stop = ["trainer.steps=8", "trainer.eval_every=100", "trainer.checkpoint_every=null", "trainer.name=es"]
    rule = "trainer.early_stopping={metric: eval/ll/loglikelihood, patience: 1, min_delta: 1000}"
    recipe, objective, dataset = build_run(_lm(tmp_path, *stop, rule))
    recipe.train(objective, dataset, name="es")
    (early,) = [r for r in journal(tmp_path, "es") if r.get("event") == "early_stop"]
    assert early["step"] == 4 and early["metric"] == "eval/ll/loglikelihood" and early["best_step"] == 2


def test_a_value_no_task_reports_is_refused_before_the_run_writes(tmp_path):
    from dew.build import build_run
    from dew.training.early_stopping import EarlyStoppingMetricError
    from dew.training.setup import check

    recipe, objective, dataset = build_run(
        _lm(tmp_path, "trainer.steps=2", "trainer.early_stopping={metric: eval/ll/acc_norm}")
    )
    with pytest.raises(
        EarlyStoppingMetricError,
        match=r"eval/ll/acc_norm.*eval/ll/perplexity, eval/loss, eval/mc/acc, eval/mc/acc_norm",
    ):
        check(recipe, objective, dataset)
    recipe, objective, dataset = build_run(
        _lm(
            tmp_path,
            "trainer.steps=2",
            f"trainer.evals.tasks=[{{name: x, path: {tmp_path / 'none.jsonl'}}}]",
            "trainer.evals.best=null",
        )
    )
    with pytest.raises(ValueError, match=r"trainer\.evals\.tasks\[0\] \(x\)\.path=.*none\.jsonl' does not exist"):
        check(recipe, objective, dataset)
    assert not (tmp_path / "ck").exists()
