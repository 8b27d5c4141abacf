"""Shared fixtures: a tiny randomly initialised Llama and a byte-level tokenizer with a chat template,
saved to a folder so tests load them through the real ``from_pretrained`` path.

``GRPO_TEST_SEED`` (default 0) is the global seed of the tiny-model tests: the random model's weights
and the training runs' ``seed``. Those tests must pass for any value (``GRPO_TEST_SEED=3 make test``);
a test whose check needs a property of the draw (step 1 has reward signal) searches seeds from it
with ``first_seed`` and fails loudly when none has the property.

``GRPO_TEST_PRECISION`` (fp32, the default, or bf16) is the precision the training tests run in
(their configs' ``bf16``), so the suite never depends on whether the CPU has native bf16: with
``GRPO_TEST_PRECISION=bf16 make test`` they train under bf16 autocast, which works, emulated, on any
CPU. Tests whose check is exact to fp32 rounding (two processes against one, fp32 invariances) pin
``bf16=False`` and say why."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from hypothesis import settings

# no per-example deadline: an example's wall time says how busy the machine is, not whether the code is right
settings.register_profile("grpo", deadline=None)
settings.load_profile("grpo")

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|pad|>")
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|pad|>"]})
    fast.chat_template = CHAT_TEMPLATE
    return fast


TEST_SEED = int(os.environ.get("GRPO_TEST_SEED", "0"))
_PRECISION = os.environ.get("GRPO_TEST_PRECISION", "fp32").lower()
if _PRECISION not in ("fp32", "bf16"):
    raise ValueError(f"GRPO_TEST_PRECISION: {_PRECISION!r} is not valid; choose fp32 or bf16")
TEST_BF16 = _PRECISION == "bf16"


def first_seed(has_property, what: str, tries: int = 10) -> int:
    """The first seed from TEST_SEED on for which ``has_property(seed)`` holds; fails the test, naming
    ``what``, when none of ``tries`` seeds does (the check it guards could not be made)."""
    for seed in range(TEST_SEED, TEST_SEED + tries):
        if has_property(seed):
            return seed
    pytest.fail(f"no seed in {TEST_SEED}..{TEST_SEED + tries - 1} has {what}")


def need_native() -> None:
    """Skip where no C compiler is installed (the native decode ops are optional); where one is, the
    build must succeed."""
    from grpo.rollout import native

    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler on PATH: the native decode ops are not built here")
    assert native.unavailable_reason() is None, native.unavailable_reason()


def build_tiny_reward_model(path):
    """A tiny random LlamaForSequenceClassification (one label) with the byte-level tokenizer, saved at path."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tok = build_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.eos_token_id, bos_token_id=None)
    LlamaForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def build_tiny_model(vocab_size: int, seed: int = 0, eos_id: int | None = None, pad_id: int | None = None):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A folder with a tiny random Llama and its tokenizer, loadable by from_pretrained."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tok = build_tokenizer()
    model = build_tiny_model(len(tok), seed=TEST_SEED, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture
def tiny_dataset(tmp_path):
    """A JSONL task of 24 arithmetic prompts."""
    path = tmp_path / "sums.jsonl"
    rows = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(1, 7) for b in range(1, 5)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path
