"""grpo export --format gguf and the model card: a trained run written as one GGUF file that transformers'
own GGUF reader loads back with the same logits (f16: to float16 tolerance; q8_0: to its quantisation) and
the same tokenizer, an Ollama Modelfile beside it, and a README.md whose header is the Hub's model metadata.

The run is a tiny random Llama with the embedded SmolLM2's real byte-level BPE tokenizer (49152 tokens, its
merges, digits split one by one), so the tokenizer section is the one a real export writes."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo.cli import main
from grpo.serve.gguf_export import interleave_heads, pre_tokenizer_name, write_gguf
from tests.conftest import build_tiny_model

TEXTS = ["What is 12 + 7? Answer: 19.", "  spaces and\nnewlines, 3.14159 and 1,000,000!", "<|im_start|>user\nhi<|im_end|>"]


@pytest.fixture(scope="module")
def smol_tiny(tmp_path_factory):
    """A tiny random Llama (untied output) over the embedded SmolLM2's tokenizer, as a model folder."""
    from grpo.models.loading import embedded_tokenizer

    tok = embedded_tokenizer()
    path = tmp_path_factory.mktemp("smol-tiny")
    model = build_tiny_model(len(tok), seed=0, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def trained(smol_tiny, tmp_path_factory):
    """One step of grpo train on it (the run folder)."""
    from tests.test_trainer import make_cfg
    from grpo.train.trainer import Trainer

    tmp = tmp_path_factory.mktemp("run")
    data = tmp / "sums.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
                            for a in range(1, 6) for b in range(1, 5)))
    cfg = make_cfg(tmp, smol_tiny, data, eval_prompts=4, max_steps=1, learning_rate=1e-2, bf16=False)
    t = Trainer(cfg)
    t.train()
    return t.run_dir


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits  # [1, T, V]


@pytest.mark.parametrize("quant,tolerance", [("f16", 2e-3), ("q8_0", 3e-2)])
def test_a_trained_run_exported_as_gguf_loads_back_in_transformers(trained, tmp_path, quant, tolerance, capsys):
    out = tmp_path / "gguf"
    assert main(["export", str(trained), "--out", str(out), "--format", "gguf", "--quant", quant]) == 0
    printed = capsys.readouterr().out
    (file,) = out.glob("*.gguf")
    # the embedded tokenizer (as transformers converts it from its GGUF) pre-tokenizes as GPT-2 does
    assert file.name == f"{trained.name}-{quant}.gguf" and "pre-tokenizer 'gpt-2'" in printed
    ckpt = sorted((trained / "checkpoints").iterdir())[-1]
    ref = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    back = AutoModelForCausalLM.from_pretrained(out, gguf_file=file.name, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(ckpt)
    # the tokenizer section is the same at every --quant: read back (a slow conversion) at f16 only
    back_tok = AutoTokenizer.from_pretrained(out, gguf_file=file.name) if quant == "f16" else None
    for text in TEXTS:
        ids = tok(text, return_tensors="pt").input_ids
        assert back_tok is None or back_tok(text).input_ids == ids[0].tolist(), text
        a, b = _logits(ref, ids), _logits(back, ids)
        assert (a - b).abs().max() <= tolerance * a.abs().max(), (quant, float((a - b).abs().max()))
    assert back_tok is None or back_tok.chat_template == tok.chat_template
    modelfile = (out / "Modelfile").read_text()
    assert modelfile.startswith(f"FROM ./{file.name}\n") and 'PARAMETER stop "<|im_end|>"' in modelfile


def test_the_model_card_is_hub_metadata_with_the_run_and_its_evaluation(trained, tmp_path):
    from huggingface_hub import ModelCard

    out = tmp_path / "hf"
    assert main(["export", str(trained), "--out", str(out)]) == 0
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "transformers" and "grpo" in card.data.tags
    assert card.data.pipeline_tag == "text-generation"
    assert card.data.base_model is None  # a local base model is no Hub repository: named in the text only
    ev = json.loads((trained / "eval.json").read_text())
    assert f"| before training | {ev['before']['accuracy']:.3f} |" in card.text
    assert f"| after training | {ev['after']['accuracy']:.3f} |" in card.text
    m = ev["after"]["measured_on"]
    assert f"| {m['cpu']} ({m['isa']}, {m['cores']} cores), torch {m['torch']}, {m['utc']} UTC |" in card.text
    assert "| `learning_rate` | 0.01 |" in card.text
    assert (out / "grpo_config.yaml").read_text() == (trained / "config.yaml").read_text()


def test_the_card_names_hub_models_and_datasets_and_not_local_paths(tmp_path):
    from huggingface_hub import ModelCard

    from grpo.serve.card import hub_id, model_card

    assert hub_id("embedded:SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert hub_id("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert hub_id(str(tmp_path)) is None and hub_id("arithmetic") is None
    text = model_card(name="m", base="embedded:SmolLM2-135M-Instruct", run=None,
                      settings={"task": "openai/gsm8k", "learning_rate": 3e-5}, formats=["gguf"])
    card = ModelCard(text)
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct" and card.data.datasets == ["openai/gsm8k"]
    assert "gguf" in card.data.tags and "No held-out evaluation was recorded" in card.text
    piped = model_card(name="m", base="b", run=None, settings={"rewards": "a|b", "task": "x\ny"}, formats=[])
    assert "| `rewards` | a\\|b |" in piped and "| `task` | x y |" in piped  # a table cell stays one cell


def test_query_and_key_rows_are_interleaved_per_head_and_f32_is_exact(smol_tiny, tmp_path):
    """llama.cpp's rotary layout: within a head, rows j and j + d/2 become rows 2j and 2j + 1; an untied
    output matrix is written as output.weight; f32 reads back bit for bit."""
    w = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2 * 4, 3)  # 2 heads of d = 4
    got = interleave_heads(w, 2)
    assert got[:, 0].tolist() == [0, 6, 3, 9, 12, 18, 15, 21]
    model = AutoModelForCausalLM.from_pretrained(smol_tiny, dtype=torch.float32).eval()
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight))
    tok = AutoTokenizer.from_pretrained(smol_tiny)
    written = write_gguf(model, tok, tmp_path / "m.gguf", quant="f32")
    assert "output.weight" in written.tensor_types and set(written.tensor_types.values()) == {"F32"}
    from gguf import GGUFReader, TokenType

    types = GGUFReader(str(tmp_path / "m.gguf")).fields["tokenizer.ggml.token_type"].contents()
    specials = [i for i, a in tok.added_tokens_decoder.items() if a.special]
    assert len(specials) > 3 and all(types[i] == TokenType.CONTROL for i in specials)  # <repo_name> and the like too
    assert types[tok.convert_tokens_to_ids("Ġthe")] == TokenType.NORMAL
    back = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf", dtype=torch.float32).eval()
    ids = tok(TEXTS[0], return_tensors="pt").input_ids
    assert torch.equal(_logits(model, ids), _logits(back, ids))


def test_pre_tokenizer_names_and_refusals(tiny_model_dir, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from grpo.errors import ConfigError

    assert pre_tokenizer_name(AutoTokenizer.from_pretrained(tiny_model_dir)) == "gpt-2"
    digits = Tokenizer(models.BPE(vocab={"a": 0}, merges=[]))  # SmolLM's and StarCoder's: digits one by one first
    digits.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False)])
    assert pre_tokenizer_name(PreTrainedTokenizerFast(tokenizer_object=digits)) == "smollm"
    digits.pre_tokenizer = pre_tokenizers.Whitespace()
    assert pre_tokenizer_name(PreTrainedTokenizerFast(tokenizer_object=digits)) is None
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(ConfigError, match="--quant: 'q4' is not valid"):
        write_gguf(model, tok, tmp_path / "x.gguf", quant="q4")
    other = AutoTokenizer.from_pretrained(tiny_model_dir)
    other.backend_tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()  # a split llama.cpp would not know
    with pytest.raises(ConfigError, match="^--gguf-pre: the tokenizer's pre-tokenizer is neither"):
        write_gguf(model, other, tmp_path / "y.gguf")
    sentencepiece = Tokenizer(models.BPE(vocab={"a": 0, "<0x41>": 1}, merges=[], byte_fallback=True))
    with pytest.raises(ConfigError, match="not byte-level BPE"):  # Llama 2's kind: llama.cpp's "llama" vocabulary
        write_gguf(model, PreTrainedTokenizerFast(tokenizer_object=sentencepiece), tmp_path / "z.gguf", pre="gpt-2")
    model.config.attention_bias = True
    with pytest.raises(ConfigError, match="biases"):
        write_gguf(model, tok, tmp_path / "w.gguf")
