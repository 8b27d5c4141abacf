"""Prompts longer than max_prompt_length never lose their system message or tool schema: they are cut
from the middle, or the run is refused at start-up with the length it needs (grpo.data.prompt_fit)."""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import AutoTokenizer

from grpo.agent import AgentSampler
from grpo.agent.sampler import AgentSettings
from grpo.data import fit_prompt, render_prompt
from grpo.data.prompt_fit import check_prompt_room, cut_middle, system_head
from grpo.errors import ConfigError
from grpo.models.loading import embedded_tokenizer
from grpo.train.trainer import Trainer

from tests.test_trainer import make_cfg

# a chat template of the Hermes / Qwen2.5 kind, written for these tests: the tools go into the system
# message as JSON inside <tools></tools>, with the call format described after them
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% else %}You are a helpful assistant."
    "{% endif %}\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n"
    "{% for m in messages %}{% if m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endif %}{% endfor %}"
    "{% else %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% endif %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LONG_QUESTION = "Add these up and say the total: " + " + ".join(str(i % 9 + 1) for i in range(260)) + "?"


def test_cut_middle_keeps_the_head_and_the_end():
    ids = list(range(40))
    assert cut_middle(ids, 10, 20) == list(range(10)) + list(range(30, 40))
    assert cut_middle(ids, 10, 40) == ids  # fits: unchanged
    assert cut_middle(ids, 0, 4) == [36, 37, 38, 39]  # no head: the left cut
    assert cut_middle(ids, 13, 20) == list(range(20, 40))  # a head leaving under MIN_TAIL (8): the left cut
    assert cut_middle(ids, 12, 20) == list(range(12)) + list(range(32, 40))


def test_the_head_is_everything_before_the_first_user_content(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)  # one token per byte
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    ids = tok(render_prompt(tok, messages), add_special_tokens=False)["input_ids"]
    head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
    assert system_head(tok, messages, ids) == len(tok(head, add_special_tokens=False)["input_ids"])
    assert system_head(tok, [{"role": "system", "content": "x"}], ids) == 0  # no user content to cut


def test_a_long_single_turn_prompt_keeps_its_system_message(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    fitted = fit_prompt(tok, LONG_QUESTION, "Answer with a number.", 200)
    assert isinstance(fitted, list) and len(fitted) == 200
    text = tok.decode(fitted)
    assert text.startswith("<|im_start|>system\nAnswer with a number.<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("?<|im_end|>\n<|im_start|>assistant\n")
    assert fit_prompt(tok, "What is 2 + 2?", "Be brief.", 200) == render_prompt(tok, "What is 2 + 2?", "Be brief.")


@pytest.fixture(scope="module")
def hermes_tokenizer():
    """The embedded SmolLM2 tokenizer with a Hermes/Qwen tool template."""
    tok = embedded_tokenizer()  # no weights converted for it
    tok.chat_template = HERMES_TEMPLATE
    return tok


def _calculator_agent(tok) -> AgentSampler:
    return AgentSampler.from_settings(AgentSettings(tools="builtin:calculator", environment_factory="",
                                                    tool_format="hermes", max_turns=2, tool_timeout=0.0,
                                                    example_call="none", example_question=""), tok)


def test_a_hermes_tool_prompt_keeps_its_schema_when_cut(hermes_tokenizer):
    tok = hermes_tokenizer
    agent = _calculator_agent(tok)
    sample = {"prompt": LONG_QUESTION, "answer": "1170"}
    head, whole = agent.start_lengths(sample, "")
    assert whole > 512 and 150 < head < 384  # the schema alone is over a third of 512 tokens
    _, ids, n = agent.start_ids(sample, agent.tools, "", None, 512)
    assert (n, len(ids)) == (whole, 512)
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n") and '<tools>{"type": "function"' in text and "</tools>" in text
    assert '"name": "calc"' in text and text.endswith("?<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ConfigError, match=rf"^max_prompt_length: {head + 4} tokens cannot hold the system message and "
                                          rf"tool schema \({head} tokens .* Set max_prompt_length=\d+"):
        check_prompt_room([(head, whole)], head + 4)
    check_prompt_room([(head, whole)], head + 8)  # room for the end of the question: cut, not refused


def test_a_run_whose_tool_schema_leaves_no_room_is_refused_at_start_up(tmp_path, tiny_model_dir, tiny_dataset):
    """The tiny tokenizer spends a token per byte: the Hermes system message with one tool takes far
    more than 256; the trainer refuses before its first step, naming the key and the length needed."""
    model_dir = tmp_path / "hermes-model"
    shutil.copytree(tiny_model_dir, model_dir)
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = HERMES_TEMPLATE
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    (model_dir / "chat_template.jinja").unlink(missing_ok=True)
    cfg = make_cfg(tmp_path, model_dir, tiny_dataset, eval_prompts=0, max_steps=1, tools="builtin:calculator",
                   tool_format="hermes", max_prompt_length=256, max_completion_length=16)
    with pytest.raises(ConfigError, match=r"^max_prompt_length: 256 tokens cannot hold .* Set max_prompt_length=\d+"):
        Trainer(cfg)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_training_cuts_long_prompts_after_the_system_message_and_counts_them(tmp_path, tiny_model_dir, capsys):
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{LONG_QUESTION} ({i})", "answer": "1170"}) + "\n"
                            for i in range(12)))
    cfg = make_cfg(tmp_path, tiny_model_dir, data, eval_prompts=0, max_steps=2, system_prompt="Be brief.",
                   max_prompt_length=128)
    t = Trainer(cfg)
    t.train()
    lines = [json.loads(line) for line in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["prompts_truncated"] for line in lines] == [cfg.prompts_per_step] * 2
    assert capsys.readouterr().out.count("prompt(s) longer than max_prompt_length=128") == 1
    _, ro = t.collector.sample(step=t.step, temperature=t.knobs.temperature)
    tok = t.tok
    for row, mask in zip(ro.prompt_ids, ro.prompt_mask):
        text = tok.decode(row[mask.bool()].tolist())
        assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")  # the middle went
        assert text.endswith("<|im_start|>assistant\n")
    t.close()
