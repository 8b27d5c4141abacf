"""grpo sft: which tokens carry the loss (by hand, on the byte-level test tokenizer: one token per
character, so the trained text can be read off exactly), bad rows named, micro-batch and padding
invariance of the gradient, and a run whose final/ folder grpo train starts from."""

import json

import pytest
import torch

from grpo.config import Config
from grpo.errors import DataError
from grpo.sft.data import encode_row, read_rows
from grpo.sft.batches import pad_batch, summed_nll
from tests.conftest import TEST_BF16, TEST_SEED, build_tokenizer

TOOL_CHAT = {"messages": [
    {"role": "system", "content": "Use calc."},
    {"role": "user", "content": "What is 12 * 34?"},
    {"role": "assistant", "content": "calc(12 * 34)"},
    {"role": "tool", "content": "408"},
    {"role": "assistant", "content": "12 * 34 = 408"}]}


def _trained_runs(tok, ex) -> list[str]:
    """The text of each run of consecutive trained tokens."""
    runs, cur = [], []
    for i, t in zip(ex.ids, ex.trained):
        if t:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    runs += [cur] if cur else []
    return [tok.decode(r) for r in runs]


def test_chat_with_tool_turns_trains_the_assistant_turns_only():
    tok = build_tokenizer()
    ex = encode_row(tok, TOOL_CHAT, max_length=1000, where="row 1")
    assert _trained_runs(tok, ex) == ["calc(12 * 34)<|im_end|>", "12 * 34 = 408<|im_end|>"]
    full = tok.apply_chat_template(TOOL_CHAT["messages"], tokenize=False)
    assert tok.decode(ex.ids) == full  # every piece of the rendering, in order, nothing added
    untrained = tok.decode([i for i, t in zip(ex.ids, ex.trained) if not t])
    assert untrained == full.replace("calc(12 * 34)<|im_end|>", "").replace("12 * 34 = 408<|im_end|>", "")
    assert "<|im_start|>assistant\n" in untrained and "408<|im_end|>" in untrained  # headers and the tool's result


def test_prompt_completion_trains_the_completion_only():
    tok = build_tokenizer()
    ex = encode_row(tok, {"prompt": "What is 2 + 2?", "completion": "4"}, max_length=1000, where="row 1")
    assert _trained_runs(tok, ex) == ["4<|im_end|>"]
    prompt = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "2+2?"}]
    ex = encode_row(tok, {"prompt": prompt, "completion": [{"role": "assistant", "content": "calc(2+2)"},
                                                           {"role": "tool", "content": "4"},
                                                           {"role": "assistant", "content": "4"}]},
                    max_length=1000, where="row 1")
    assert _trained_runs(tok, ex) == ["calc(2+2)<|im_end|>", "4<|im_end|>"]  # not the prompt's assistant turn


def test_truncation_keeps_the_start_and_is_flagged():
    tok = build_tokenizer()
    full = encode_row(tok, TOOL_CHAT, max_length=1000, where="row 1")
    cut = encode_row(tok, TOOL_CHAT, max_length=len(full.ids) - 10, where="row 1")
    assert cut.truncated and not full.truncated and cut.ids == full.ids[:len(full.ids) - 10]
    with pytest.raises(DataError, match="row 1: no trained token within sft_max_length=20"):
        encode_row(tok, TOOL_CHAT, max_length=20, where="row 1")


@pytest.mark.parametrize("rows, message", [
    ('{"messages": [{"role": "user", "content": "hi"}]}\n', "row 1: no assistant message"),
    ('{"prompt": "a", "completion": "b"}\n{"text": "x"}\n', "row 2: a row needs 'messages'"),
    ('{"messages": [{"role": "robot", "content": "hi"}]}\n', "row 1 messages: message 0 must be"),
    ('{"prompt": "a", "completion": "b"}\nnot json\n', "line 2 is not valid JSON"),
])
def test_bad_rows_are_named(tmp_path, rows, message):
    from grpo.sft.data import load_examples

    path = tmp_path / "data.jsonl"
    path.write_text(rows)
    with pytest.raises(DataError, match=message):
        load_examples(path, build_tokenizer(), max_length=100)


def test_gradient_same_for_any_micro_batch_and_padding(tiny_model_dir):
    """The batch's loss as one padded micro-batch and as rows one at a time (no padding): same gradient."""
    from transformers import AutoModelForCausalLM

    tok = build_tokenizer()
    rows = [encode_row(tok, TOOL_CHAT, max_length=1000, where="a"),
            encode_row(tok, {"prompt": "What is 2 + 2?", "completion": "4"}, max_length=1000, where="b")]
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float64)
    tokens = sum(sum(r.trained[1:]) for r in rows)

    def grad(batches):
        model.zero_grad(set_to_none=True)
        for b in batches:
            (summed_nll(model, pad_batch(b, tok.pad_token_id), autocast=False) / tokens).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    torch.testing.assert_close(grad([rows]), grad([[rows[0]], [rows[1]]]), rtol=1e-9, atol=1e-12)


def test_sft_run_then_grpo_train_from_its_final_folder(tmp_path, tiny_model_dir, tiny_dataset):
    from grpo.cli import main
    from grpo.train.trainer import Trainer

    data = tmp_path / "chats.jsonl"
    data.write_text("\n".join(json.dumps(TOOL_CHAT) for _ in range(4)) + "\n"
                    + json.dumps({"prompt": "What is 2 + 2?", "completion": "4"}) + "\n")
    run = tmp_path / "sft"
    assert main(["sft", f"model={tiny_model_dir}", f"sft_data={data}", f"output_dir={run}", "sft_epochs=4",
                 "sft_batch_size=5", "learning_rate=3e-3", "progress=false", "report_to=none", f"seed={TEST_SEED}",
                 f"bf16={str(TEST_BF16).lower()}"]) == 0
    result = json.loads((run / "sft.json").read_text()) | {"final": str(run / "final")}
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4] and result["steps"] == 4
    assert lines[-1]["loss"] < lines[0]["loss"]  # the same five rows each step: the loss falls
    assert (run / "checkpoints" / "step-4").is_dir() and json.loads((run / "sft.json").read_text())["steps"] == 4
    grpo = Config(model=result["final"], task=str(tiny_dataset), output_dir=str(tmp_path / "rl"), max_steps=1,
                  num_generations=2, prompts_per_step=2, max_completion_length=4, eval_prompts=0,
                  rewards="tests.rewards_for_tests:digit_share", progress=False, report_to="none", reward_timeout=0.0,
                  bf16=TEST_BF16)
    trainer = Trainer(grpo)
    from safetensors.torch import load_file

    saved = load_file(str(run / "final" / "model.safetensors"))
    compared = 0
    for name, p in trainer.policy.named_parameters():  # grpo train starts from the supervised weights
        if name in saved:
            torch.testing.assert_close(p.detach(), saved[name])
            compared += 1
    assert compared == len(saved) > 0  # every saved tensor, by its name
    trainer.train()
    assert (tmp_path / "rl" / "checkpoints" / "step-1").is_dir()


def test_lora_sft_final_folder_has_the_adapters_merged(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from grpo.cli import main

    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps(TOOL_CHAT) + "\n")
    assert main(["sft", f"model={tiny_model_dir}", f"sft_data={data}", f"output_dir={tmp_path / 'sft'}",
                 "sft_epochs=2", "learning_rate=5e-2", "use_peft=true", "lora_r=4", "progress=false",
                 "report_to=none", f"bf16={str(TEST_BF16).lower()}"]) == 0
    result = {"final": str(tmp_path / "sft" / "final")}
    assert (tmp_path / "sft" / "checkpoints" / "step-2" / "adapter_config.json").is_file()
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    final = AutoModelForCausalLM.from_pretrained(result["final"])
    moved = [n for n, p in final.named_parameters() if not torch.equal(p, base.state_dict()[n])]
    assert moved and all("proj" in n for n in moved)  # the adapted linear layers, merged into plain weights
    assert read_rows(data)[0] == TOOL_CHAT
