"""policy_loss=distill in a run: the teacher is loaded as the run's reference (a model folder, or a
LoRA run folder with its adapters merged), its log-probs reach the loss, and a teacher of another
vocabulary or a distill run without a teacher is refused."""

import math

import pytest
import torch

from grpo.config import Config
from grpo.errors import ConfigError
from grpo.models.teacher import load_teacher
from grpo.train.trainer import Trainer
from tests.conftest import TEST_SEED, build_tiny_model, build_tokenizer
from tests.test_trainer import make_cfg


class _Quiet:
    def note(self, *a, **k):
        pass

    def log_step(self, *a, **k):
        pass

    def log_samples(self, *a, **k):
        pass

    def close(self):
        pass


def _other_model(path, seed: int, tok=None):
    tok = tok or build_tokenizer()
    model = build_tiny_model(len(tok), seed=seed, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _step(tmp_path, tiny_model_dir, tiny_dataset, teacher, name):
    cfg = make_cfg(tmp_path / name, tiny_model_dir, tiny_dataset, policy_loss="distill", teacher=str(teacher), beta=0.0,
                   max_steps=1, eval_prompts=0)
    t = Trainer(cfg)
    t.logger = _Quiet()
    try:
        return t, t.train_step()
    finally:
        t.close()


def test_teacher_is_the_reference_and_its_logps_reach_the_loss(tmp_path, tiny_model_dir, tiny_dataset):
    teacher = _other_model(tmp_path / "teacher", seed=TEST_SEED + 1)
    t, metrics = _step(tmp_path, tiny_model_dir, tiny_dataset, teacher, "a")
    from transformers import AutoModelForCausalLM

    own = AutoModelForCausalLM.from_pretrained(str(teacher)).state_dict()
    student = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).state_dict()
    ref = t.models.reference.state_dict()
    assert all(torch.equal(ref[k], own[k]) for k in own)  # the reference is the teacher, not the student
    assert not all(torch.equal(ref[k], student[k]) for k in student)
    assert not any(p.requires_grad for p in t.models.reference.parameters())
    # another model's log-probs reach the loss: the sampled reverse KL is not 0 (two random tiny models are
    # near-uniform, so its sample mean can be as small as 5e-6: GRPO_TEST_SEED=23), where the student as its
    # own teacher gives exactly 0 (below)
    assert metrics["distill_reverse_kl"] != 0.0 and metrics["trained_sequence_share"] == 1.0
    # the student as its own teacher: log pi_theta - log pi_teacher is 0 on every sampled token
    _, same = _step(tmp_path, tiny_model_dir, tiny_dataset, tiny_model_dir, "b")
    assert same["distill_reverse_kl"] == 0.0 and abs(same["loss"]) < 1e-5


def test_distillation_trains_the_lora_adapters_against_the_teacher(tmp_path, tiny_model_dir, tiny_dataset):
    """use_peft with a teacher: the reference is the teacher (not the base with adapters off), its
    log-probs reach the loss, and only the adapters move."""
    teacher = _other_model(tmp_path / "teacher", seed=TEST_SEED + 1)
    cfg = make_cfg(tmp_path / "run", tiny_model_dir, tiny_dataset, policy_loss="distill", teacher=str(teacher),
                   beta=0.0, max_steps=1, eval_prompts=0, use_peft=True, lora_r=4, learning_rate=0.05)
    t = Trainer(cfg)
    t.logger = _Quiet()
    try:
        before = {n: p.detach().clone() for n, p in t.policy.named_parameters()}
        metrics = t.train_step()
        moved = [n for n, p in t.policy.named_parameters() if not torch.equal(p.detach(), before[n])]
        from transformers import AutoModelForCausalLM

        own = AutoModelForCausalLM.from_pretrained(str(teacher)).state_dict()
        ref = t.models.reference.state_dict()
        assert all(torch.equal(ref[k], own[k]) for k in own)  # the teacher, untouched by the student's adapters
    finally:
        t.close()
    # the teacher's log-probs reach the loss: the adapters (B zero at the start: the student is its base)
    # get a gradient, which a teacher equal to the student would not give
    assert math.isfinite(metrics["distill_reverse_kl"]) and metrics["trained_sequence_share"] == 1.0
    assert moved and all("lora_" in n for n in moved)


def test_lora_run_folder_teacher_has_its_adapters_merged(tmp_path, tiny_model_dir, tiny_dataset):
    from grpo.serve.models import load_policy, source_of

    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, use_peft=True, lora_r=4, max_steps=1, eval_prompts=0,
                   learning_rate=0.1)
    Trainer(cfg).train()
    teacher = load_teacher(cfg.output_dir, dtype="float32", student_tokenizer=build_tokenizer())
    merged, _ = load_policy(source_of(cfg.output_dir))  # grpo export's merge, another path to the same weights
    for name, p in merged.state_dict().items():
        torch.testing.assert_close(teacher.state_dict()[name], p)
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).state_dict()
    assert any(not torch.equal(plain[k], v) for k, v in teacher.state_dict().items())  # the adapters moved it


def test_teacher_of_another_vocabulary_and_distill_without_teacher_are_refused(tmp_path, tiny_model_dir):
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|extra|>"]})
    other = _other_model(tmp_path / "other", seed=0, tok=tok)
    with pytest.raises(ConfigError, match="another vocabulary"):
        load_teacher(str(other), dtype="float32", student_tokenizer=build_tokenizer())
    with pytest.raises(ConfigError, match="teacher: policy_loss=distill"):
        Config(policy_loss="distill")
    with pytest.raises(ConfigError, match="ref_reset_steps"):
        Config(policy_loss="distill", teacher=str(tiny_model_dir), ref_reset_steps=2)
