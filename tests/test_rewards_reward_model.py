"""grpo.rewards.reward_model: a sequence-classification model as a batched reward."""

from __future__ import annotations

import warnings

import pytest
import torch

from grpo.rewards import REWARDS, RewardOptions, resolve_reward
from grpo.rewards import reward_model as rm
from grpo.rewards.runner import RewardRunner
from grpo.rewards.scoring import score_completions
from tests.conftest import build_tiny_reward_model, build_tokenizer


@pytest.fixture(scope="module")
def tiny_rm_dir(tmp_path_factory):
    """A tiny random LlamaForSequenceClassification (one label) with the byte-level tokenizer."""
    return build_tiny_reward_model(tmp_path_factory.mktemp("tiny-rm"))


PROMPTS = ["What is 2 + 2?", "Name a colour.", "What is 2 + 2?"]
COMPLETIONS = ["4", "blue, or maybe a much longer answer that needs padding", "five"]


def test_batched_scores_equal_one_at_a_time_and_a_plain_forward(tiny_rm_dir):
    scorer = rm.RewardModelScorer(str(tiny_rm_dir), batch_size=3, device="cpu")
    batched = scorer.score(PROMPTS, COMPLETIONS)
    single = [scorer.score([p], [c])[0] for p, c in zip(PROMPTS, COMPLETIONS)]
    assert batched == pytest.approx(single, abs=1e-5)  # right padding does not change a score
    # by hand: the one-label head's logit at the last token of the chat-rendered pair
    text = scorer.tok.apply_chat_template([{"role": "user", "content": PROMPTS[0]},
                                           {"role": "assistant", "content": COMPLETIONS[0]}], tokenize=False)
    ids = scorer.tok(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        manual = scorer.model(**ids).logits[0, 0].item()
    assert batched[0] == pytest.approx(manual, abs=1e-5)
    assert batched[0] != pytest.approx(batched[2], abs=1e-6)  # different completions, different scores


def test_reward_model_reward_through_the_runner(tiny_rm_dir):
    samples = [{"prompt": p, "answer": ""} for p in PROMPTS]
    # in worker mode too: the batched reward runs in the trainer's process, once for the whole batch
    runner = RewardRunner(["reward_model"], None, RewardOptions(timeout=5.0, retries=0, reward_model=str(tiny_rm_dir)))
    try:
        res = runner.score(COMPLETIONS, samples)
    finally:
        runner.close()
    expected = rm.RewardModelScorer(str(tiny_rm_dir), device="cpu").score(PROMPTS, COMPLETIONS)
    assert res.per_reward["reward_model"].tolist() == pytest.approx(expected, abs=1e-5)
    assert res.failures["reward_model"] == 0


def test_unconfigured_reward_model_is_a_counted_failure():
    for reward in (REWARDS["reward_model"], resolve_reward("reward_model")):  # the entry, and built without a model
        res = score_completions(["a", "b"], [{"prompt": "x"}, {"prompt": "y"}], {"reward_model": reward})
        assert res.failures["reward_model"] == 2 and torch.isnan(res.total).all()
        assert "reward_model" in res.messages[0]


def test_each_reward_holds_its_own_settings_and_warns_on_its_first_wide_batch(tiny_rm_dir):
    """Two reward-model rewards of different transforms side by side (no setting shared through the
    module); each warns about a wide raw spread on its own first batch only (seed 003 section 4.1)."""
    plain = resolve_reward("reward_model", RewardOptions(reward_model=str(tiny_rm_dir)))
    with torch.no_grad():
        plain.fn.scorer.model.score.weight.mul_(1e5)  # the real model, its head scaled: raw scores far apart
    minmax = resolve_reward("reward_model", RewardOptions(reward_model=str(tiny_rm_dir),
                                                          reward_model_transform="group_minmax"))
    minmax.fn.use(plain.fn.scorer)
    samples = [{"prompt": p} for p in PROMPTS]
    with pytest.warns(UserWarning, match="first batch's raw scores span .*reward_model_transform=none"):
        raw = plain(COMPLETIONS, samples)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its second batch is not checked
        assert plain(COMPLETIONS, samples) == pytest.approx(raw)
    with pytest.warns(UserWarning, match="reward_model_transform=group_minmax"):
        mapped = minmax(COMPLETIONS + COMPLETIONS[:1], samples + samples[:1])
    assert max(raw) - min(raw) > 20 and mapped[:2] == [0.0, 0.0]  # one-completion groups: 0 after min-max
    assert sorted(mapped[2:]) == pytest.approx([0.0, 1.0])  # the last group: two different completions
    assert plain.fn.transform == "none" and minmax.fn.transform == "group_minmax"


def test_config_needs_a_model_for_the_reward_model_reward():
    from grpo.config import Config, ConfigError

    with pytest.raises(ConfigError, match="reward_model"):
        Config(rewards="reward_model")


def test_two_training_steps_with_the_reward_model(tmp_path, tiny_model_dir, tiny_dataset, tiny_rm_dir, monkeypatch):
    import json

    from grpo.train.trainer import Trainer
    from tests.test_trainer import make_cfg

    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, rewards="reward_model", reward_model=str(tiny_rm_dir),
                   max_steps=2, eval_prompts=0)
    t = Trainer(cfg)
    t.train()
    lines = [json.loads(l) for l in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [1, 2]
    assert all(l["reward_failures"] == 0 and l["reward_std"] > 0 for l in lines)  # a random RM still varies


def test_plain_text_reward_models_keep_special_tokens_and_the_completion_end(tmp_path):
    """A reward model without a chat template (BERT-style) gets its tokenizer's special tokens
    ([CLS] ... [SEP] here), and a pair longer than max_length loses the start of the prompt, never
    the end of the completion (review: both were lost)."""
    from tokenizers.processors import TemplateProcessing
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tok = build_tokenizer()
    tok.chat_template = None
    tok.add_special_tokens({"cls_token": "[CLS]", "sep_token": "[SEP]"})
    tok._tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", tok.cls_token_id), ("[SEP]", tok.sep_token_id)])
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=tok.pad_token_id)
    LlamaForSequenceClassification(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    scorer = rm.RewardModelScorer(str(tmp_path), device="cpu", max_length=16)
    assert not scorer.templated
    text = scorer.render("a long prompt that will not fit", "END")
    enc = scorer.tok([text], truncation=True, max_length=16, add_special_tokens=True)
    ids = enc["input_ids"][0]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id and len(ids) == 16
    assert scorer.tok.decode(ids[-4:-1]) == "END"  # the completion's end survived truncation
    with torch.no_grad():
        manual = scorer.model(input_ids=torch.tensor([ids])).logits[0, 0].item()
    assert scorer.score(["a long prompt that will not fit"], ["END"])[0] == pytest.approx(manual, abs=1e-5)
