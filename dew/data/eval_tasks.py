"""Downstream tasks read from their JSON Lines files and tokenized as lm-evaluation-harness 0.4.13
tokenizes them, into rows of fixed shapes for the compiled scoring (``dew.training.task_evals``), and
the values the scores give (``trainer.evals``, ``dew.contract.evals``; docs/eval.md).

What is read from lm-evaluation-harness 0.4.13 (``lm_eval/api/task.py``, ``lm_eval/api/model.py``,
``lm_eval/models/huggingface.py``), and done here the same way:

- A ``multiple_choice`` example is one request per choice, ``(context, target_delimiter + choice)``;
  a ``loglikelihood`` example one, ``(context, continuation)``.
- ``_encode_pair``: the context's trailing whitespace moves to the front of the continuation; the
  context and the continuation are encoded together and the context alone, and the continuation's
  ids are the whole's past the context's (so a token that spans the boundary is the continuation's).
  Encoding is transformers' ``tokenizer.encode`` with its special tokens (a tokenizer whose
  post-processor puts a begin-of-text token first puts it there), none for a string that starts with
  the prefix token's text. An empty context is the prefix token (the begin-of-text token, else the
  end-of-text one), the continuation encoded without special tokens (when the continuation starts
  with the prefix token, its first token is the context instead).
- ``_loglikelihood_tokens``: the row is ``(context + continuation)[-(max_length + 1):][:-1]`` (cut
  from the left past the model's length; here ``seq_len``), the continuation's ids its last targets;
  a continuation longer than ``seq_len`` is refused (the harness asserts).
- ``process_results``: ``acc`` is whether the argmax of the choices' summed log-likelihoods is the
  gold one, ``acc_norm`` the same over the log-likelihoods divided by each choice's length in
  characters (``len(choice)``, without the delimiter), the first of equal values winning (NumPy's
  argmax); a ``loglikelihood`` example's ``acc`` is whether each continuation token was the most
  likely one, and the task's ``perplexity`` exp of minus the mean log-likelihood.

Rows are padded on the right to a few fixed lengths (``buckets``: powers of two up to ``seq_len``)
and grouped into batches of ``trainer.evals.batch_size`` rows, so that each length compiles once for
the whole run, whatever the examples. A causal model's logits at a position do not depend on what
follows it, so the padding changes no score.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence

import numpy as np
from etils import epath

from dew.contract.evals import EvalTask
from dew.data.tokenizer import ByteTokenizer, PretrainedTokenizer, Tokenizer

SMALLEST_BUCKET = 16
"""The shortest row length compiled: shorter rows are padded to it."""


class TaskError(ValueError):
    """A task file that cannot be scored: missing, not JSON Lines, an example without a field the
    task names, a gold choice that is not one of the choices, a continuation longer than the model."""


# ---------------------------------------------------------------------------- tokenizing as the harness


@dataclasses.dataclass(frozen=True)
class HarnessEncoding:
    """A dew tokenizer encoding as transformers' fast tokenizer of the same ``tokenizer.json`` does
    in lm-evaluation-harness: ``encode`` with the tokenizer's special tokens, ``plain`` without."""

    tokenizer: Tokenizer

    @property
    def prefix_id(self) -> int:
        """The harness's ``prefix_token_id``: the begin-of-text token, else the end-of-text one."""
        bos = getattr(self.tokenizer, "bos_id", None)
        return int(bos) if bos is not None else int(self.tokenizer.eos_id)

    def encode(self, text: str) -> list[int]:
        """``tok_encode``: with the post-processor's special tokens, unless ``text`` starts with the
        prefix token's text (``has_bos_prefix``)."""
        tok = self.tokenizer
        if isinstance(tok, ByteTokenizer):  # dew-export writes it as a byte-level BPE without merges or specials
            return tok.encode(text).tolist()
        special = not text.startswith(tok.tokenizer.id_to_token(self.prefix_id) or "\0")
        return list(tok.tokenizer.encode(text, add_special_tokens=special).ids)

    def plain(self, text: str) -> list[int]:
        """``tok_encode(add_special_tokens=False)``."""
        tok = self.tokenizer
        if isinstance(tok, ByteTokenizer):
            return tok.encode(text).tolist()
        if isinstance(tok, PretrainedTokenizer):
            return tok.encode(text).tolist()
        return list(tok.tokenizer.encode(text, add_special_tokens=False).ids)

    def pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """The ids of ``context`` and of ``continuation`` after it (``loglikelihood`` with
        ``_encode_pair``)."""
        if context == "":
            ids = self.plain(continuation)
            if ids and ids[0] == self.prefix_id:
                return ids[:1], ids[1:]
            return [self.prefix_id], ids
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.encode(context + continuation)
        head = self.encode(context)
        return head, whole[len(head) :]


# ---------------------------------------------------------------------------- the task file


@dataclasses.dataclass(frozen=True)
class Example:
    """One example: its requests' (context ids, continuation ids) and what scores them."""

    context: str
    choices: tuple[str, ...]
    """A multiple-choice example's choices as written (``acc_norm`` divides by their lengths); a
    log-likelihood example's continuation alone."""
    gold: int
    """The right choice's index (0 for a log-likelihood example)."""
    texts: tuple[tuple[str, str], ...]
    """Per choice, the (context, continuation) the harness's ``loglikelihood`` request holds."""
    requests: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
    """Per choice, the (context, continuation) ids as the harness encodes them."""


@dataclasses.dataclass(frozen=True)
class Task:
    """A task's examples, tokenized."""

    spec: EvalTask
    examples: tuple[Example, ...]

    def requests(self) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        return [r for e in self.examples for r in e.requests]


def read_examples(spec: EvalTask, where: str) -> list[dict]:
    """The task file's examples (its first ``limit``), each a JSON object; errors name ``where``."""
    path = epath.Path(spec.path)
    if not path.exists():
        raise TaskError(f"{where}.path={spec.path!r} does not exist")
    examples = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise TaskError(f"{where}: {spec.path} line {number} is not JSON ({err.msg})") from None
        if not isinstance(value, dict):
            raise TaskError(f"{where}: {spec.path} line {number} is a {type(value).__name__}, not a JSON object")
        examples.append(value)
        if spec.limit is not None and len(examples) == spec.limit:
            break
    if not examples:
        raise TaskError(f"{where}: {spec.path} holds no example")
    return examples


def _field(example: dict, key: str, option: str, where: str) -> object:
    if key not in example:
        raise TaskError(f"{where} has no field {key!r} ({option}={key!r}); its fields: {', '.join(example) or 'none'}")
    return example[key]


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TaskError(f"{what} must be a string, got {type(value).__name__} {value!r}")
    return value


def parse(spec: EvalTask, example: dict, where: str) -> tuple[str, tuple[str, ...], int]:
    """(context, choices, gold index) of one example, checked; a log-likelihood example's choices
    are its continuation alone."""
    context = _text(_field(example, spec.context_field, "context_field", where), f"{where}: {spec.context_field}")
    if spec.kind == "loglikelihood":
        field = spec.continuation_field
        continuation = _text(_field(example, field, "continuation_field", where), f"{where}: {field}")
        if not continuation:
            raise TaskError(f"{where}: {field} is empty; there is nothing to score")
        return context, (continuation,), 0
    choices = _field(example, spec.choices_field, "choices_field", where)
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise TaskError(f"{where}: {spec.choices_field} must be a list of non-empty strings, got {choices!r}")
    gold = _field(example, spec.gold_field, "gold_field", where)
    if isinstance(gold, str) and not gold.isdigit():
        if gold not in choices:
            raise TaskError(f"{where}: {spec.gold_field}={gold!r} is not one of its choices {choices!r}")
        gold = choices.index(gold)
    if isinstance(gold, bool) or not isinstance(gold, int | str) or not 0 <= int(gold) < len(choices):
        raise TaskError(
            f"{where}: {spec.gold_field}={gold!r} must be a choice's index, 0 to {len(choices) - 1}, or its text"
        )
    return context, tuple(choices), int(gold)


def load_task(spec: EvalTask, encoding: HarnessEncoding, seq_len: int, where: str) -> Task:
    """The task ``spec`` names, read and tokenized for a model of ``seq_len`` tokens."""
    examples = []
    for i, raw in enumerate(read_examples(spec, where)):
        at = f"{where}: {spec.path} example {i}"
        context, choices, gold = parse(spec, raw, at)
        if spec.kind == "multiple_choice":
            continuations = [spec.target_delimiter + c for c in choices]
        else:
            continuations = list(choices)
        requests = []
        for continuation in continuations:
            head, tail = encoding.pair(context, continuation)
            if not tail:
                raise TaskError(f"{at}: the continuation {continuation!r} encodes to no token")
            if len(tail) > seq_len:
                raise TaskError(
                    f"{at}: the continuation {continuation[:40]!r}... is {len(tail)} tokens, more than the "
                    f"model's seq_len={seq_len}"
                )
            requests.append((tuple(head), tuple(tail)))
        texts = tuple((context, c) for c in continuations)
        examples.append(Example(context, choices, gold, texts, tuple(requests)))
    return Task(spec, tuple(examples))


# ---------------------------------------------------------------------------- rows of fixed shapes


def buckets(seq_len: int) -> list[int]:
    """The row lengths compiled: powers of two from ``SMALLEST_BUCKET`` below ``seq_len``, and ``seq_len``."""
    lengths = []
    n = SMALLEST_BUCKET
    while n < seq_len:
        lengths.append(n)
        n *= 2
    return [*lengths, seq_len]


@dataclasses.dataclass(frozen=True)
class RowBatch:
    """``batch_size`` rows of one length: the model's inputs, the targets, which targets are the
    continuation's, and the request each row scores (-1: a padding row)."""

    inputs: np.ndarray
    """``[rows, length]`` int32."""
    targets: np.ndarray
    """``[rows, length]`` int32: each input's next token."""
    mask: np.ndarray
    """``[rows, length]`` bool: the continuation's targets."""
    request: np.ndarray
    """``[rows]`` int: the request (over all the tasks' requests, in order) each row scores."""


def row(context: Sequence[int], continuation: Sequence[int], seq_len: int) -> tuple[list[int], list[int], int]:
    """(inputs, targets, continuation length) of one request: the last ``seq_len + 1`` ids of the
    context and the continuation, less the last for the inputs and the first for the targets."""
    ids = [*context, *continuation][-(seq_len + 1) :]
    return ids[:-1], ids[1:], len(continuation)


def row_batches(
    requests: Sequence[tuple[Sequence[int], Sequence[int]]], seq_len: int, batch_size: int
) -> list[RowBatch]:
    """Every request as a row, in batches of ``batch_size`` rows of one bucket's length each, the
    last batch of a bucket filled with padding rows."""
    lengths = buckets(seq_len)
    by_bucket: dict[int, list[int]] = {}
    built = [row(c, t, seq_len) for c, t in requests]
    for i, (ids, _, _) in enumerate(built):
        by_bucket.setdefault(next(b for b in lengths if b >= len(ids)), []).append(i)
    batches = []
    for length in sorted(by_bucket):
        members = by_bucket[length]
        for start in range(0, len(members), batch_size):
            chunk = members[start : start + batch_size]
            inputs = np.zeros((batch_size, length), np.int32)
            targets = np.zeros((batch_size, length), np.int32)
            mask = np.zeros((batch_size, length), bool)
            request = np.full(batch_size, -1, np.int64)
            for r, i in enumerate(chunk):
                x, y, n = built[i]
                inputs[r, : len(x)], targets[r, : len(y)] = x, y
                mask[r, len(x) - n : len(x)] = True
                request[r] = i
            batches.append(RowBatch(inputs, targets, mask, request))
    return batches


# ---------------------------------------------------------------------------- the values


@dataclasses.dataclass(frozen=True)
class Scored:
    """One example's scores: each request's summed log-likelihood and whether it was greedy."""

    loglikelihoods: tuple[float, ...]
    greedy: tuple[bool, ...]
    gold: int
    prediction: int
    """The choice of the largest log-likelihood (``acc``'s)."""
    prediction_norm: int
    """The choice of the largest log-likelihood per character (``acc_norm``'s)."""


def score_examples(task: Task, lls: np.ndarray, greedy: np.ndarray) -> list[Scored]:
    """Each example's scores from its requests' (``task.requests()`` order) log-likelihoods and greedy flags."""
    out, at = [], 0
    for e in task.examples:
        n = len(e.requests)
        ll = [float(x) for x in lls[at : at + n]]
        lengths = np.array([float(len(c)) for c in e.choices])
        out.append(
            Scored(
                tuple(ll),
                tuple(bool(g) for g in greedy[at : at + n]),
                e.gold,
                int(np.argmax(ll)),
                int(np.argmax(np.array(ll) / lengths)),
            )
        )
        at += n
    return out


def task_values(task: Task, scored: Sequence[Scored]) -> dict[str, float]:
    """The values the task reports, by key (``EvalTask.values``)."""
    name = task.spec.name
    if task.spec.kind == "loglikelihood":
        mean = sum(s.loglikelihoods[0] for s in scored) / len(scored)
        return {
            f"eval/{name}/acc": sum(s.greedy[0] for s in scored) / len(scored),
            f"eval/{name}/loglikelihood": mean,
            f"eval/{name}/perplexity": math.exp(min(-mean, 700.0)),
        }
    return {
        f"eval/{name}/acc": sum(s.prediction == s.gold for s in scored) / len(scored),
        f"eval/{name}/acc_norm": sum(s.prediction_norm == s.gold for s in scored) / len(scored),
    }


def load_tasks(
    specs: Sequence[EvalTask], encoding: HarnessEncoding, seq_len: int, field: str = "trainer.evals.tasks"
) -> list[Task]:
    """Every task of ``specs``, read and tokenized; errors name ``field[i]``."""
    return [load_task(s, encoding, seq_len, f"{field}[{i}] ({s.name})") for i, s in enumerate(specs)]
