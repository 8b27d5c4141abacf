"""step_reward=prm:<folder>: a process reward model in Math-Shepherd's form scores each step by its label
words' probabilities at the step's tag, and the score lands on the step's last token: the token advantages
of a two-step completion equal the hand-computed ones."""

from __future__ import annotations

import json
import math

import pytest
import torch

from grpo import core
from grpo.errors import ConfigError
from grpo.rewards.prm import PRMScorer, PRMSpec, prm_input, split_steps
from grpo.rewards.steps import resolve_step_reward, step_tensors
from tests.conftest import build_tiny_model, build_tokenizer

SPEC = PRMSpec(step_tag="#", good="+", bad="-", separator="\n")


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory):
    """A tiny random Llama over the byte-level test tokenizer (every ASCII character one token) as a PRM."""
    path = tmp_path_factory.mktemp("prm")
    tok = build_tokenizer()
    build_tiny_model(len(tok), seed=1, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id).save_pretrained(path)
    tok.save_pretrained(path)
    SPEC.write(path)
    return path


def test_steps_split_by_the_rule_with_their_end_offsets():
    text = "2 + 3 = 5\n\n5 * 4 = 20\nSo 20. "
    assert split_steps(text) == [("2 + 3 = 5", 9), ("5 * 4 = 20", 21), ("So 20.", 28)]
    assert split_steps("a. b. c", ". ") == [("a", 1), ("b", 4), ("c", 7)]  # the separator is not kept


def test_each_steps_score_is_the_good_words_share_at_its_tag(prm_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    scorer = resolve_step_reward(f"prm:{prm_dir}")
    assert isinstance(scorer, PRMScorer) and scorer.spec == SPEC
    completion = "2 + 3 = 5\n5 * 4 = 21"
    got = scorer(completion, {"prompt": "What is (2 + 3) * 4?"})
    # by hand: the model's logits at each '#' of "question step_1 #\nstep_2 #\n"
    tok, model = AutoTokenizer.from_pretrained(prm_dir), AutoModelForCausalLM.from_pretrained(prm_dir).eval()
    text = prm_input("What is (2 + 3) * 4?", ["2 + 3 = 5", "5 * 4 = 21"], SPEC)
    assert text == "What is (2 + 3) * 4? 2 + 3 = 5 #\n5 * 4 = 21 #\n"
    ids = tok(text, add_special_tokens=False).input_ids
    tag, good, bad = (tok.convert_tokens_to_ids(c) for c in ("#", "+", "-"))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    want = []
    for pos in [i for i, t in enumerate(ids) if t == tag]:
        g, b = float(logits[pos, good]), float(logits[pos, bad])
        want.append(1 / (1 + math.exp(b - g)))
    assert [e for _, e in got] == [9, 20] and len(want) == 2
    assert all(math.isclose(a, w, rel_tol=1e-5) for (a, _), w in zip(got, want)), (got, want)


def test_the_prm_scores_land_on_each_steps_last_token_and_make_the_advantages(prm_dir):
    tok = build_tokenizer()
    scorer = resolve_step_reward(f"prm:{prm_dir}")
    texts = ["1 + 1 = 2\n2 + 2 = 4", "1 + 1 = 3\n3 + 3 = 6"]  # two completions of one prompt (G = 2)
    ids = [tok(t, add_special_tokens=False).input_ids for t in texts]
    t_max = max(map(len, ids))
    completion_ids = torch.tensor([i + [tok.pad_token_id] * (t_max - len(i)) for i in ids])  # [N, T]
    mask = torch.tensor([[1] * len(i) + [0] * (t_max - len(i)) for i in ids])  # [N, T]
    sample = {"prompt": "What is 1 + 1, then doubled?"}
    rewards, ends, problems = step_tensors(scorer, tok, completion_ids, mask, texts, [sample, sample])
    assert not problems
    assert ends.tolist() == [[8, len(ids[0]) - 1], [8, len(ids[1]) - 1]]  # byte-level: char 9 ends at token 8
    r = [[s for s, _ in scorer(t, sample)] for t in texts]
    assert torch.allclose(rewards, torch.tensor(r, dtype=torch.float64))
    adv = core.process_advantages(rewards, ends, mask, group_size=2, std_eps=1e-6, unbiased_std=True)  # [N, T]
    flat = torch.tensor(r, dtype=torch.float64).flatten()
    norm = ((flat - flat.mean()) / (flat.std() + 1e-6)).reshape(2, 2)  # the group's four step rewards
    for i in range(2):  # tokens of step 1 get both steps' normalized rewards, step 2's tokens only its own
        assert torch.allclose(adv[i, :9].double(), (norm[i, 0] + norm[i, 1]).expand(9), atol=1e-5)
        assert torch.allclose(adv[i, 9:len(ids[i])].double(), norm[i, 1].expand(len(ids[i]) - 9), atol=1e-5)


def test_a_folder_that_is_no_prm_is_a_clear_error(tmp_path, prm_dir):
    with pytest.raises(ConfigError, match="no model folder there"):
        resolve_step_reward(f"prm:{tmp_path}")
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "prm.json").write_text('{"tag": "#"}')
    with pytest.raises(ConfigError, match="not a PRM spec"):
        resolve_step_reward(f"prm:{tmp_path}")


def test_a_steps_label_is_the_share_of_its_continuations_the_verifier_accepts(tiny_model_dir, tmp_path):
    """`grpo prm label` on the tiny model (random text, split at its frequent U+FFFD so solutions have several
    steps; verifier: has a digit). By hand: each continued step's soft label is the share of its recorded
    continuations that, appended to the solution up to the step, hold a digit; the hard label is any; the
    last step's label is the solution's own verdict; and a recorded continuation is what the model draws
    from that prefix alone with the same key."""
    from grpo.cli import main
    from grpo.data import render_prompt
    from grpo.rollout import make_engine
    from grpo.rollout.engine import SamplingSettings
    from grpo.rollout.keys import row_keys
    from tests.rewards_for_tests import has_digit
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {a} + 1?", "answer": str(a + 1)}) + "\n" for a in range(8)))
    out = tmp_path / "labels.jsonl"
    sep = "\ufffd"
    assert main(["prm", "label", "--model", str(tiny_model_dir), "--task", str(data), "--out", str(out), "--prompts",
                 "2", "--solutions", "2", "--continuations", "3", "--separator", sep, "--seed", "7",
                 "rewards=tests.rewards_for_tests:has_digit", "max_completion_length=10", "temperature=1.0",
                 "eval_prompts=2"]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    continued = [(r, k) for r in rows for k in range(len(r["steps"]) - 1)]
    assert len(continued) >= 3, "too few continued steps for the check to say anything"
    for r in rows:
        assert r["soft"][-1] == float(has_digit(r["solution"], r)) == float(r["correct"])
        assert r["hard"] == [float(v > 0) for v in r["soft"]]
    for r, k in continued:
        prefix = r["solution"][:r["solution"].index(r["steps"][k]) + len(r["steps"][k])] + sep
        verdicts = [has_digit(prefix + c, r) >= 1.0 for c in r["continuations"][k]]
        assert len(verdicts) == 3 and r["soft"][k] == sum(verdicts) / 3
    assert any(0 < v < 1 for r, k in continued for v in [r["soft"][k]]) or len({r["soft"][k] for r, k in continued}) > 1
    # the first continued step's first continuation, drawn again alone with its key
    tok, model = AutoTokenizer.from_pretrained(tiny_model_dir), AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    engine = make_engine("hf", model, tok)
    r, k = continued[0]
    prefix = r["solution"][:r["solution"].index(r["steps"][k]) + len(r["steps"][k])] + sep
    again = engine.generate([render_prompt(tok, r["prompt"], "") + prefix], group_size=1,
                            sampling=SamplingSettings(max_new_tokens=10, temperature=1.0, max_prompt_length=512),
                            keys=row_keys(7, 1, 0, 1))
    assert engine.same_tokens_for_keys and again.texts[0] == r["continuations"][k][0]


def test_grpo_prm_train_learns_the_labels_and_reports_the_heldout_step_accuracy(prm_dir, tmp_path):
    """Steps saying 'yes' are labelled good and 'no' bad: trained on 48 solutions, the PRM's held-out step
    accuracy (12 solutions) is high, and step_reward=prm: on its folder scores a 'yes' step above a 'no' one."""
    from grpo.cli import main

    rng = __import__("random").Random(0)
    rows = []
    for i in range(60):
        words = [rng.choice(["yes", "no"]) for _ in range(rng.randint(2, 3))]
        rows.append({"prompt": f"Q{i}?", "steps": [f"s {w}" for w in words], "soft": [float(w == "yes") for w in words]})
    data = tmp_path / "labels.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "prm"
    assert main(["prm", "train", "--data", str(data), "--model", str(prm_dir), "--out", str(out), "--epochs", "8",
                 "--lr", "3e-3", "--heldout", "0.2", "--step-tag", "#", "--good", "+", "--bad", "-"]) == 0
    result = json.loads((out / "prm_train.json").read_text())
    assert result["heldout_solutions"] == 12 and result["loss_last"] < result["loss_first"]
    assert result["step_accuracy_after"] >= 0.95, result
    scorer = resolve_step_reward(f"prm:{out}")
    (yes, _), (no, _) = scorer("s yes\ns no", {"prompt": "Q99?"})
    assert yes > 0.8 and no < 0.2


def test_a_run_with_process_supervision_by_the_prm(prm_dir, tmp_path, tiny_model_dir, tiny_dataset):
    from grpo.train.trainer import Trainer
    from tests.test_trainer import make_cfg

    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, supervision="process", step_reward=f"prm:{prm_dir}",
                   eval_prompts=0, max_steps=1)
    t = Trainer(cfg)
    t.train()
    line = json.loads((t.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert line["step_reward_failures"] == 0 and 0 < line["step_reward_mean"] < 1  # probabilities of the PRM
    assert line["steps_per_completion"] >= 1 and math.isfinite(line["loss"])


def test_the_prm_scores_a_batch_as_it_scores_each_completion(prm_dir):
    """outcomes (the trainer's call: 16 solutions a forward, right-padded) equals one forward per completion,
    for completions of different lengths and step counts, across a batch boundary."""
    scorer = PRMScorer(str(prm_dir))
    texts = ["a\nbb\nccc", "one step", "x\n\ny\nz\nw", "", "long " * 12 + "\nend"]
    samples = [{"prompt": f"Q{i}?"} for i in range(len(texts))]
    batched = scorer.outcomes(texts, samples, batch=2)
    for text, sample, got in zip(texts, samples, batched):
        alone = scorer(text, sample)
        assert [e for _, e in got] == [e for _, e in alone]
        assert [v for v, _ in got] == pytest.approx([v for v, _ in alone], abs=1e-5)


def test_a_tag_of_several_tokens_is_read_at_its_last_token_even_where_the_question_holds_it(prm_dir):
    """step_tag 'ки' is four byte-level tokens of the test tokenizer (two per character) and the question holds
    it too: each step's margin is read at the last byte of that step's own tag (by hand: the byte length of the
    text up to the tag's last character, less one), not at the question's tag nor at the character's first byte."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo.rewards.prm import label_ids, tag_margins, tag_positions

    spec = PRMSpec(step_tag="ки", good="+", bad="-")
    tok, model = AutoTokenizer.from_pretrained(prm_dir), AutoModelForCausalLM.from_pretrained(prm_dir).eval()
    question, steps = "Is ки a tag?", ["2 + 2 = 4", "so 4"]
    text = prm_input(question, steps, spec)
    assert text == "Is ки a tag? 2 + 2 = 4 ки\nso 4 ки\n"
    chars = tag_positions(question, steps, spec)
    assert chars == [24, 32] and all(text[c] == "и" and text[c + 1] == "\n" for c in chars)
    at = [len(text[:c + 1].encode()) - 1 for c in chars]  # the last byte of each step's tag
    ids = label_ids(tok, spec)
    with torch.no_grad():
        got = tag_margins(model, tok, [{"prompt": question, "steps": steps}], spec, ids)
        logits = model(tok(text, return_tensors="pt", add_special_tokens=False).input_ids).logits[0]  # [L, V]
    want = logits[at, ids["good"]] - logits[at, ids["bad"]]  # [2]
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, logits[[a - 1 for a in at], ids["good"]] - logits[[a - 1 for a in at], ids["bad"]])
