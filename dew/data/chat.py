"""``chat``: conversations for fine-tuning a causal language model, each packed whole into windows with
a ``loss_mask`` that trains the responses and not the prompts.

A record is either (``data.style``):

- ``messages``: a list of ``{"role": ..., "content": ...}`` turns, rendered to text by the
  tokenizer's own chat template (``chat_template.jinja``, or ``chat_template`` in the
  ``tokenizer_config.json`` beside its ``tokenizer.json``), as transformers' ``apply_chat_template``
  renders it; the tokens of each ``assistant`` turn (what the template writes for it after the
  generation prompt, its end-of-turn token included) carry loss, every other token none;
- ``prompt_response``: two text fields, framed as a document (the begin-of-text id, or without
  one the end-of-text id, then the prompt, the response and the end-of-text id); the response and
  the end-of-text id carry loss.

The turns are rendered incrementally: the text up to each assistant turn's generation prompt, and up
to the end of that turn, must each begin the next (as every common template does); a template that
rewrites earlier turns is refused naming the record. Each part is encoded on its own, so a prompt
token never merges with a response token.

The records are read through ``datasets`` (JSONL, Parquet, a ``save_to_disk`` directory:
``dew.data.hf_sources``) and tokenized once, at load, in memory: a fine-tuning set, not a corpus.
The conversations are then packed whole into windows of ``seq_len + 1`` (``dew.data.packing``;
one longer than a window is cut into pieces, each trained on its own), so a batch carries
``tokens``, ``segment_ids``, ``positions`` and ``loss_mask``, and is read shuffled, sharded and
resumed as ``token_windows`` is (``dew.data.pipeline``).

transformers is not a dependency of dew (it brings torch); its ``apply_chat_template`` is Jinja2's
sandboxed environment with ``trim_blocks`` and ``lstrip_blocks``, the loop controls extension and
the globals ``raise_exception`` and ``strftime_now``, which ``ChatTemplate`` sets up the same way.
A template's ``{% generation %}`` blocks (transformers' own tag for assistant masks) are not
needed here and not read.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from dew.data.hf_sources import Source, resolve
from dew.data.packing import DocumentWindows, Framing, PackedTable
from dew.data.tokenizer import TOKENIZER_CONFIG, PretrainedTokenizer, Tokenizer, absolute_record, load_tokenizer
from dew.data.tokens import TokenDataset

if TYPE_CHECKING:
    import jinja2

    from dew.data.fields import ChatFields

TEMPLATE_FILE = "chat_template.jinja"


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """A tokenizer's chat template, compiled, and the special tokens it is rendered with."""

    source: str
    """Where it was read from, for errors."""
    template: jinja2.Template = dataclasses.field(repr=False, compare=False)
    special: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """``bos_token``, ``eos_token``... as ``tokenizer_config.json`` names them."""

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> ChatTemplate:
        """The template beside a pretrained tokenizer's ``tokenizer.json``, or a ValueError saying
        where it was looked for."""
        if not isinstance(tokenizer, PretrainedTokenizer):
            raise ValueError(
                "data.style=messages renders each conversation with the tokenizer's chat template: data.tokenizer "
                "must name a Hugging Face tokenizer (a model directory or its tokenizer.json)"
            )
        directory = os.path.dirname(tokenizer.file)
        config: dict = {}
        config_file = os.path.join(directory, TOKENIZER_CONFIG)
        if os.path.isfile(config_file):
            with open(config_file) as f:
                config = json.load(f)
        text, source = config.get("chat_template"), config_file
        if os.path.isfile(os.path.join(directory, TEMPLATE_FILE)):
            source = os.path.join(directory, TEMPLATE_FILE)
            with open(source) as f:
                text = f.read()
        if isinstance(text, list):  # named templates: [{"name": "default", "template": ...}, ...]
            text = next((t.get("template") for t in text if t.get("name") == "default"), None)
        if not isinstance(text, str):
            raise ValueError(
                f"data.tokenizer: no chat template in {directory} (neither {TEMPLATE_FILE} nor chat_template in "
                f"{TOKENIZER_CONFIG}); give records with prompt and response fields and data.style=prompt_response"
            )
        special = {k: v for k, v in ((k, special_token(config[k])) for k in config if k.endswith("_token")) if v}
        return cls(source, compile_template(text), special)

    def render(self, messages: Sequence[Mapping[str, object]], add_generation_prompt: bool = False) -> str:
        return self.template.render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, **self.special
        )


def special_token(value: object) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string, or ``{"content": ...}``."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def compile_template(text: str) -> jinja2.Template:
    """``text`` compiled as transformers compiles a chat template (module docstring)."""
    import jinja2.ext
    import jinja2.sandbox

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(fmt: str) -> str:
        return datetime.datetime.now().strftime(fmt)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    return env.from_string(text)


def conversation_parts(
    template: ChatTemplate, messages: Sequence[Mapping[str, object]], where: str
) -> list[tuple[str, int]]:
    """The rendered conversation as ``(text, trained)`` parts: each assistant turn's text trained
    (1), the rest not (0)."""
    parts: list[tuple[str, int]] = []
    done = ""
    for k, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise ValueError(f"{where}: turn {k} is {message!r}, not a {{role, content}} record")
        if message["role"] != "assistant":
            continue
        before = template.render(messages[:k], add_generation_prompt=True)
        after = template.render(messages[: k + 1])
        if not before.startswith(done) or not after.startswith(before):
            raise ValueError(
                f"{where}: the chat template ({template.source}) rewrites earlier turns when a turn is added, "
                "so the assistant's tokens cannot be told apart"
            )
        parts += [(before[len(done) :], 0), (after[len(before) :], 1)]
        done = after
    full = template.render(messages)
    if not full.startswith(done):
        raise ValueError(f"{where}: the chat template ({template.source}) renders the whole conversation differently")
    return [(text, trained) for text, trained in [*parts, (full[len(done) :], 0)] if text]


def encode_parts(tokenizer: Tokenizer, parts: Sequence[tuple[str, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Each part encoded on its own: the ids and, per id, whether it is trained."""
    ids = [tokenizer.encode(text) for text, _ in parts]
    mask = [np.full(len(i), trained, np.int32) for i, (_, trained) in zip(ids, parts)]
    return np.concatenate(ids or [np.zeros(0, np.int32)]).astype(np.int32), np.concatenate(
        mask or [np.zeros(0, np.int32)]
    )


def framed_pair(tokenizer: Tokenizer, prompt: str, response: str) -> tuple[np.ndarray, np.ndarray]:
    """A prompt and its response as one document (module docstring), and its loss mask."""
    bos = getattr(tokenizer, "bos_id", None)
    start = np.array([bos if bos is not None else tokenizer.eos_id], np.int32)
    p, r = tokenizer.encode(prompt).astype(np.int32), tokenizer.encode(response).astype(np.int32)
    ids = np.concatenate([start, p, r, np.array([tokenizer.eos_id], np.int32)])
    mask = np.concatenate([np.zeros(1 + len(p), np.int32), np.ones(len(r) + 1, np.int32)])
    return ids, mask


def text_field(record: Mapping[str, object], option: str, field: str, where: str) -> str:
    """``record[field]`` as text, or an error naming the record and the option ``data.<option>``."""
    value = record.get(field)
    if not isinstance(value, str):
        raise ValueError(f"data.{option}={field!r}: {where} holds {type(value).__name__} there, not text")
    return value


def encode_records(spec: ChatFields, source: Source, tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every record of ``source`` encoded back to back: ``(ids, loss_mask, ends)``, ``ends`` the end
    offset of each conversation."""
    data = source.open()
    template = ChatTemplate.of(tokenizer) if spec.style == "messages" else None
    if spec.style == "prompt_response" and spec.response_field not in data.column_names:
        raise ValueError(
            f"data.response_field={spec.response_field!r}: {source} has no such column; "
            f"it has {', '.join(data.column_names)}"
        )
    ids, masks = [], []
    for i, record in enumerate(data):
        where = f"record {i} of {source}"
        if template is not None:
            messages = record[spec.messages_field]
            if not isinstance(messages, list) or not messages:
                raise ValueError(
                    f"{where}: data.messages_field={spec.messages_field!r} holds {messages!r}, not a list of turns"
                )
            a, m = encode_parts(tokenizer, conversation_parts(template, messages, where))
        else:
            prompt = text_field(record, "prompt_field", spec.prompt_field, where)
            a, m = framed_pair(tokenizer, prompt, text_field(record, "response_field", spec.response_field, where))
        if not m[1:].any():
            raise ValueError(f"{where}: no assistant turn (or an empty response): nothing of it would be trained")
        ids.append(a)
        masks.append(m)
    return np.concatenate(ids), np.concatenate(masks), np.cumsum([len(a) for a in ids])


def windows_of(spec: ChatFields, source: Source, tokenizer: Tokenizer) -> DocumentWindows:
    """The conversations of ``source`` packed whole into windows (``dew.data.packing``)."""
    ids, mask, ends = encode_records(spec, source, tokenizer)
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    framing = Framing(tokenizer.eos_id, has_bos=True)  # framed already: no end-of-text id goes before
    return DocumentWindows(PackedTable([ids], spec.seq_len, framing, bounds=[(starts, ends)], loss_masks=[mask]))


def load_chat(spec: ChatFields, batch_size: int, seed: int) -> TokenDataset:
    """The conversations of ``spec.path`` (and ``spec.val_path``) at global batch ``batch_size``,
    shuffled from ``seed``."""
    tokenizer = load_tokenizer(spec.tokenizer, "data.tokenizer")
    field = spec.messages_field if spec.style == "messages" else spec.prompt_field
    train = windows_of(spec, resolve(spec.path, split=spec.split, field=field, fmt=spec.format), tokenizer)
    held_out = None
    if spec.val_path:
        val = resolve(spec.val_path, field=field, fmt=spec.format, what="data.val_path")
        held_out = windows_of(spec, val, tokenizer)
    return TokenDataset(
        name=spec.name,
        train=train,
        held_out=held_out,
        batch_size=batch_size,
        seed=seed,
        fields={"vocab_size": tokenizer.vocab_size, "seq_len": spec.seq_len},
        tokens_per_record=train.targets_per_record,
        tokenizer=absolute_record(tokenizer),
    )
