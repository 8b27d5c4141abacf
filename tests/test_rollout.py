"""The HF sampler: group layout, masks up to the first EOS, and sampling log-probs that match a
recomputation under the same temperature."""

import torch

from grpo.models import load_models
from grpo.policy import completion_logprobs
from grpo.rollout import completion_mask_from_ids, generate_rollout


def test_mask_stops_after_first_eos():
    ids = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8]])
    out = completion_mask_from_ids(ids, [2])
    assert out["mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert out["truncated"].tolist() == [False, True]


def test_sampling_logprobs_match_recomputed(tiny_model_dir):
    m = load_models(str(tiny_model_dir), need_reference=False)
    torch.manual_seed(0)
    ro = generate_rollout(m.policy, m.tokenizer, ["What is 1 + 1?", "Hi"], group_size=3, max_new_tokens=6,
                          temperature=0.7)
    assert ro.completion_ids.shape[0] == 6 and len(ro.texts) == 6
    assert torch.equal(ro.prompt_ids[0], ro.prompt_ids[2])  # rows are grouped by prompt
    with torch.no_grad():
        again = completion_logprobs(m.policy, ro.prompt_ids, ro.prompt_mask, ro.completion_ids,
                                    ro.completion_mask, temperature=0.7)["logp"]
    mask = ro.completion_mask.bool()
    torch.testing.assert_close(ro.sampling_logp[mask], again[mask], atol=1e-4, rtol=0)
