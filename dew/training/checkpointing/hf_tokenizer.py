"""The tokenizer files of a Hugging Face model directory, for the tokenizer a run's data was encoded
with (``dew.data.tokenizer``): ``tokenizer.json`` (the ``tokenizers`` library's file, which
transformers' fast tokenizers wrap) and ``tokenizer_config.json`` (the class and the special
tokens), so that ``AutoTokenizer.from_pretrained(OUT)`` gives the ids dew trained on.

A BPE tokenizer is already a ``tokenizers`` file: it is copied. dew's byte tokenizer (ids 0..255 the
UTF-8 bytes, 256 ``<|endoftext|>``) is written as one: a BPE without merges over GPT-2's 256
byte-level symbols, each symbol's id its byte, with ``<|endoftext|>`` added as a special token.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping

from dew.data.tokenizer import BYTE_VOCAB, EOS
from dew.data.tokenizer_identity import byte_symbols

TOKENIZER, TOKENIZER_CONFIG = "tokenizer.json", "tokenizer_config.json"


def byte_tokenizer() -> str:
    """dew's byte tokenizer as a ``tokenizer.json`` (the file's text)."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {s: b for b, s in enumerate(byte_symbols())}
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([tokenizers.AddedToken(EOS, special=True)])
    assert tok.token_to_id(EOS) == BYTE_VOCAB - 1
    return str(tok.to_str())


def write(record: Mapping[str, object] | None, out: str, *, max_length: int) -> list[str]:
    """Write the tokenizer files of a run's tokenizer ``record`` (its data's, ``file`` resolved)
    into ``out``; nothing for a run without one. Returns the files written."""
    if record is None:
        return []
    kind = record.get("kind")
    target = os.path.join(out, TOKENIZER)
    if kind == "pretrained":  # a model's own tokenizer (the one a warm start from its directory trained on)
        return pretrained(record, out, max_length=max_length)
    if kind == "bpe":
        shutil.copyfile(str(record["file"]), target)
    elif kind == "byte":
        with open(target, "w") as fh:
            fh.write(byte_tokenizer())
    else:
        raise ValueError(f"the run's tokenizer record {dict(record)}: kind={kind!r} has no Hugging Face form")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
    }
    with open(os.path.join(out, TOKENIZER_CONFIG), "w") as fh:
        json.dump(config, fh, indent=2)
    return [TOKENIZER, TOKENIZER_CONFIG]


def pretrained(record: Mapping[str, object], out: str, *, max_length: int) -> list[str]:
    """A pretrained tokenizer's files as the run kept them: its ``tokenizer.json``, and its
    ``tokenizer_config.json`` where the model directory had one (its special tokens, chat template
    and class, unchanged), else one naming the end-of-text (and begin-of-text) tokens by their ids'
    names."""
    import tokenizers

    source = str(record["file"])
    shutil.copyfile(source, os.path.join(out, TOKENIZER))
    config_source = os.path.join(os.path.dirname(source), TOKENIZER_CONFIG)
    if os.path.isfile(config_source):
        shutil.copyfile(config_source, os.path.join(out, TOKENIZER_CONFIG))
        return [TOKENIZER, TOKENIZER_CONFIG]
    tok = tokenizers.Tokenizer.from_file(source)
    config: dict[str, object] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
    }
    for key, field in (("eos_token", "eos_id"), ("bos_token", "bos_id")):
        if isinstance(token_id := record.get(field), int):
            config[key] = tok.id_to_token(token_id)
    with open(os.path.join(out, TOKENIZER_CONFIG), "w") as fh:
        json.dump(config, fh, indent=2)
    return [TOKENIZER, TOKENIZER_CONFIG]
