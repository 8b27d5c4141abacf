"""Mutation checks: each entry of MUTATIONS breaks one feature by a one-line change, and the tests it
names must then fail. ``python tests/mutations/run.py`` (``make mutations``) applies each in a copy
of the checkout (the working tree is never touched), runs the named tests there, and prints one line
per mutation; it exits 1 when any mutation survives (its tests still pass) or no longer applies (the
line it changes moved: update the entry). ``-k TEXT`` runs the entries whose name holds TEXT.

A test is only trusted once breaking its feature makes it fail: these are the breaks kept.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # the file changed, relative to the checkout
    old: str  # a line (or part of one) found exactly once in it
    new: str
    tests: tuple[str, ...]  # node ids that must fail with it


MUTATIONS = (
    Mutation("a turn's block of calls ends at its first call", "grpo/agent/call_base.py",
             "            if nxt is None or nxt[0] != 0:", "            if True:",
             ("tests/test_call_formats.py::test_a_block_ends_where_text_that_starts_no_call_follows",
              "tests/test_call_formats.py::test_two_calls_in_one_turn_of_the_embedded_model_reach_both_tools")),
    Mutation("a result turn is cut at the wrong place in the template's rendering", "grpo/agent/episodes.py",
             "            return tokenizer(full[at + block.end:], add_special_tokens=False)[\"input_ids\"]",
             "            return tokenizer(full[at + block.spans[0][0]:], add_special_tokens=False)[\"input_ids\"]",
             ("tests/test_call_formats.py::test_episode_tokens_are_the_sampled_ones_where_the_template_re_renders_past_turns",)),
    Mutation("chat_template_kwargs are not given to the template", "grpo/models/loading.py",
             "    if not kwargs:\n        return\n    template", "    if True:\n        return\n    template",
             ("tests/test_call_formats.py::test_chat_template_kwargs_reach_the_rendered_prompt_and_the_saved_template",)),
    Mutation("an agent program's later call is rendered afresh, not continued", "grpo/agent/programs.py",
             "        if n and msgs[:n] == ep.history:", "        if False:",
             ("tests/test_agent_programs.py::test_each_episode_is_one_sample_with_both_calls_and_the_turn_between",)),
    Mutation("an OpenEnv episode's reward is its first step's only", "grpo/agent/openenv.py",
             "        return float(sum(self.rewards))", "        return float(self.rewards[0]) if self.rewards else 0.0",
             ("tests/test_openenv.py::test_a_session_resets_steps_with_the_servers_action_schema_and_adds_its_rewards",)),
    Mutation("the engines report pi_T, not the log q they drew from", "grpo/rollout/fast.py",
             "            logps[live, t] = core.processed_logprobs(scores, tok, seen=mine, **sampler.settings)",
             "            logps[live, t] = torch.log_softmax(scores.float() / sampler.settings['temperature'], -1)"
             ".gather(1, tok[:, None])[:, 0]",
             ("tests/test_sampling_logprobs.py::test_the_engines_draw_alike_and_report_log_q_which_the_trainer_recomputes",)),
    Mutation("the update's correction compares pi_T with the engine's log q", "grpo/train/update.py",
             "        old_q = batch.old_qlogp[idx] if batch.old_qlogp is not None else cur[\"qlogp\"] if \"qlogp\" in cur else old",
             "        old_q = old",
             ("tests/test_sampling_logprobs.py::test_a_corrected_run_under_truncation_weighs_its_own_tokens_by_one[1]",)),
    Mutation("the repetition penalty ignores the context", "grpo/core/sampling.py",
             "        s = torch.where(seen, torch.where(s < 0, s * repetition_penalty, s / repetition_penalty), s)  # [M, V]",
             "        s = s",
             ("tests/core/test_sampling.py::test_processed_scores_are_transformers_processors",)),
    Mutation("a hung rollout worker is waited for without a deadline", "grpo/cluster/rollout.py",
             "got = self._ray.get(ref, timeout=max(left, 0.0))", "got = self._ray.get(ref)",
             ("tests/test_cluster.py::test_a_worker_killed_mid_step_is_restarted_and_the_run_ends_with_the_same_weights"
              "[rollout-worker-killed-then-one-hung]",)),
    Mutation("a rollout worker keeps its replica from before the trainer ranks restarted", "grpo/cluster/rollout.py",
             "if self.engine is not None and self.epoch == epoch:", "if self.engine is not None:",
             ("tests/test_cluster.py::test_a_trainer_rank_killed_restarts_the_run_from_its_checkpoint_with_the_same_weights[ddp-before-a-checkpoint]",)),
    Mutation("a rollout worker's tokens carry no version", "grpo/cluster/rollout.py",
             "            if self.numbered:  # every token", "            if False:  # every token",
             ("tests/test_cluster.py::test_async_rollouts_on_ray_draw_ahead_with_tokens_of_older_weights",)),
    Mutation("a run restarted before any checkpoint keeps the dead attempt's files in the way", "grpo/cluster/driver.py",
             "for name in (\"metrics.jsonl\", \"checkpoints\", \"samples.jsonl\", \"tensorboard\"):", "for name in ():",
             ("tests/test_cluster.py::test_a_trainer_rank_killed_restarts_the_run_from_its_checkpoint_with_the_same_weights[ddp-before-a-checkpoint]",)),
    Mutation("a restarted rollout worker gets the first weights as the newest", "grpo/cluster/rollout.py",
             "load.remote(latest, version))", "load.remote(self.whole_ref, version))",
             ("tests/test_cluster.py::test_a_worker_killed_mid_step_is_restarted_and_the_run_ends_with_the_same_weights[rollout-worker-killed-then-one-hung]",)),
    Mutation("a rank's second rollout worker draws from the first block's keys", "grpo/cluster/rollout.py",
             "keys=None if keys is None else [keys[r] for r in rows]", "keys=None if keys is None else keys[:len(rows)]",
             ("tests/test_cluster.py::test_a_worker_killed_mid_step_is_restarted_and_the_run_ends_with_the_same_weights[rollout-worker-killed-then-one-hung]",)),
    Mutation("the reward workers' blocks come back in the wrong order", "grpo/cluster/rewards.py",
             "        order = sorted(parts)", "        order = sorted(parts, reverse=True)",
             ("tests/test_cluster.py::test_a_ray_run_with_two_trainer_ranks_and_two_rollout_workers_is_the_single_process_run",)),
    Mutation("a dead reward worker's block is not scored again", "grpo/cluster/rewards.py",
             "            if len(got) == len(parts):", "            if True:",
             ("tests/test_cluster.py::test_a_worker_killed_mid_step_is_restarted_and_the_run_ends_with_the_same_weights[reward-worker-lora]",)),
    Mutation("the run restarts from the start after a trainer rank dies", "grpo/cluster/driver.py",
             "        if (run_dir / \"checkpoints\" / \"latest\").exists():", "        if False:",
             ("tests/test_cluster.py::test_a_trainer_rank_killed_restarts_the_run_from_its_checkpoint_with_the_same_weights[fsdp2-after-step-1]",)),
    Mutation("the scheduler ignores fallback_fits", "grpo/serve/batcher.py",
             "self.last is first and self.fallback_fits(first, other)", "self.last is first and True",
             ("tests/test_serve_engine.py::test_the_scheduler_gives_the_fallback_no_step_that_would_make_a_grpo_row_"
              "miss_its_deadline",)),
    Mutation("the fallback's stream is held until complete", "grpo/serve/stream.py",
             "on_tokens=lambda ids: loop.call_soon_threadsafe(queue.put_nowait, ids), **kw)", "on_tokens=None, **kw)",
             ("tests/test_serve.py::test_the_fallbacks_stream_arrives_as_it_is_decoded",)),
    Mutation("the shared-trunk value head keeps its own process's gradients", "grpo/train/critic.py",
             "            distributed.average_grads(self.params, self.world)", "            pass",
             ("tests/test_distributed.py::test_two_processes_equal_one[ppo_shared-ddp]",)),
    Mutation("a mini-batch's policy pass erases the shared trunk's value gradients", "grpo/train/update.py",
             "        world = self.world\n        todo = [",
             "        world = self.world\n        self.optimizer.zero_grad(set_to_none=True)\n        todo = [",
             ("tests/test_trainer.py::test_ppo_shared_trunk_trains_head_and_body",)),
    Mutation("the difficulty sampler is fed zeros", "grpo/train/collect.py",
             "self.last_pass_rates = correct.double().view(s.prompts_per_step, -1).mean(1).tolist()",
             "self.last_pass_rates = [0.0] * s.prompts_per_step",
             ("tests/test_mixture_training.py::test_the_difficulty_sampler_hears_each_prompts_own_pass_rate",)),
    Mutation("partial_rollouts is not wired to the engine process", "grpo/train/settings.py",
             "segment_tokens=cfg.partial_rollout_tokens if cfg.partial_rollouts else 0)", "segment_tokens=0)",
             ("tests/test_async_rollouts.py::test_partial_rollouts_reach_the_engine_process",)),
    Mutation("a raising verifier accepts the answer", "grpo/serve/scheme.py",
             '    except Exception:\n        return "verifier_error"', "    except Exception:\n        return None",
             ("tests/test_serve_scheme.py::test_a_raising_verifier_rejects_the_answer_and_the_fallback_answers",)),
    Mutation("grpo serve ignores the run's prompt limit", "grpo/serve/server.py",
             "max_prompt_tokens=args.max_prompt_tokens or src.max_prompt_length or 1024,",
             "max_prompt_tokens=args.max_prompt_tokens or 1024,",
             ("tests/test_serve_command.py::test_the_runs_prompt_limit_is_the_servers",)),
    Mutation("a module skipped at import counts as one test", "tests/skip_groups.py",
             'entry["tests"] += 1 if "::" in nodeid else items_in(nodeid)', 'entry["tests"] += 1',
             ("tests/test_suite_isolation.py::test_a_module_skipped_at_import_counts_as_its_tests",)),
    Mutation("CI=true accepts every skip", "tests/skip_groups.py",
             "if group not in ALLOWED_UNDER_CI]", "if False]",
             ("tests/test_suite_isolation.py::test_under_ci_only_the_allowed_groups_may_go_untested",)),
    Mutation("a settings default disagrees with its Config field", "grpo/rewards/reward.py",
             "timeout: float = 10.0  # reward_timeout", "timeout: float = 0.0  # reward_timeout",
             ("tests/test_settings_sources.py::test_settings_built_from_the_default_config_equal_their_own_defaults",)),
    Mutation("grpo eval samples with generate whatever the run's engine", "grpo/cli.py",
             'name = (run_engine.standalone or cfg.rollout_engine) if run_engine.serves_evaluation else "hf"',
             'name = "hf"',
             ("tests/test_cli.py::test_grpo_eval_samples_with_the_engine_evaluation_in_training_uses",)),
    Mutation("the knobs write into the step's metrics", "grpo/train/knobs.py",
             "seen = {**metrics, **added}", "seen = metrics\n        seen.update(added)",
             ("tests/test_settings.py::test_knobs_from_settings_alone_move_as_their_controllers_say",)),
    Mutation("async publishes every weight after the first", "grpo/rollout/producer.py",
             "views = self.views if first else {n: self.views[n] for n in self.trainable}", "views = self.views",
             ("tests/test_async_rollouts.py::test_with_lora_max_staleness_zero_is_the_synchronous_run_and_moves_only_"
              "the_adapters[hf]",)),
    Mutation("a LoRA policy is sharded at its PEFT wrapper", "grpo/infra/distributed.py",
             'fully_shard(model.get_base_model() if hasattr(model, "get_base_model") else model)', "fully_shard(model)",
             ("tests/test_composition.py::test_every_torchrun_pair_that_runs_trains_two_steps[lora+fsdp2]",)),
    Mutation("num_train_epochs is ignored", "grpo/train/trainer.py",
             "steps = epoch_steps(cfg.num_train_epochs, len(self.task.train), cfg.prompts_per_step)",
             "steps = cfg.max_steps",
             ("tests/test_first_hour.py::test_num_train_epochs_runs_the_steps_of_one_pass",)),
    Mutation("off a terminal there is no progress line", "grpo/infra/logger.py",
             "self.plain = _PlainProgress(total_steps, start_step)", "self.plain = None",
             ("tests/test_first_hour.py::test_a_non_terminal_gets_whole_progress_lines",)),
    Mutation("a mixture's pass@k prompts are not summed", "grpo/eval/suites.py",
             'out["pass_prompts"] = sum(r.get("pass_prompts", 0) for r in sampled)', 'out["pass_prompts"] = 0',
             ("tests/test_first_hour.py::test_a_mixture_of_two_files_with_evaluation_ends_with_its_summary",)),
    Mutation("the connection cap is removed", "grpo/infra/http.py",
             "full = self.active >= self.limits.max_connections", "full = False",
             ("tests/test_http_deadlines.py::test_the_connection_cap_alone_refuses_the_third_connection",)),
    Mutation("the request gate is never taken", "grpo/infra/http.py",
             "        if not self._sem.acquire(blocking=False):", "        if False:",
             ("tests/test_http_deadlines.py::test_the_request_gate_alone_refuses_work_past_its_bound",)),
    Mutation("a request head has only a per-read timeout", "grpo/infra/http.py",
             "watch = Cutoff(self.connection, self.server.limits.head_timeout_s, socket.SHUT_RD)",
             "watch = Cutoff(self.connection, 1e9, socket.SHUT_RD)",
             ("tests/test_http_deadlines.py::test_two_trickled_heads_lose_their_slots_and_an_honest_request_is_served",)),
    Mutation("grpo serve reads a trickled head for as long as it lasts", "grpo/serve/app.py",
             "        super().connection_made(transport)\n        self._head_timer = self.loop.call_later(",
             "        super().connection_made(transport)\n        self._head_timer = None and self.loop.call_later(",
             ("tests/test_serve_command.py::test_every_attack_class_gets_its_status_and_the_server_keeps_serving",)),
    Mutation("exchange() has only per-read timeouts", "grpo/infra/http_client.py",
             "watch = Cutoff(sock, left())", "watch = Cutoff(sock, 1e9)",
             ("tests/test_http_deadlines.py::test_exchange_returns_at_its_deadline_from_a_server_that_trickles[head]",)),
    Mutation("bitsandbytes' kernel-fetch warning is let through", "grpo/infra/quiet.py",
             "            self.messages.append(message)\n            return False",
             "            self.messages.append(message)\n            return True",
             ("tests/test_first_hour.py::test_bitsandbytes_kernel_fetch_warning_is_held_back_until_qlora_asks",)),
    Mutation("serve's completeness check is not measured", "grpo/serve/server.py",
             "    state.scheme.completeness = choice.name", "    pass",
             ("tests/test_serve_completeness.py::test_serve_answers_a_user_reward_run_as_itself",)),
    Mutation("a resume may change the split", "grpo/train/trainer.py",
             "run_state.check_resumable(resume_from, cfg.to_dict())", "pass",
             ("tests/test_first_hour.py::test_a_refused_resume_leaves_the_config_and_names_the_key",)),
    Mutation("the evaluation keeps 32 tokens", "grpo/config/fields.py",
             "self.eval_max_new_tokens = self.max_completion_length", "self.eval_max_new_tokens = 32",
             ("tests/test_first_hour.py::test_the_evaluation_gets_the_room_training_gets",)),
    Mutation("long prompts are cut from the left", "grpo/data/prompt_fit.py",
             "return ids[:head] + ids[len(ids) - (max_length - head):]", "return ids[len(ids) - max_length:]",
             ("tests/test_prompt_fit.py::test_a_long_single_turn_prompt_keeps_its_system_message",
              "tests/test_prompt_fit.py::test_a_hermes_tool_prompt_keeps_its_schema_when_cut")),
    Mutation("a lone surrogate reaches the tokenizer", "grpo/serve/protocol.py",
             'value.encode("utf-8")', 'value.encode("utf-8", "surrogatepass")',
             ("tests/test_serve.py::test_completions_prompt_type_checked",)),
    Mutation("stale tokens leave the distillation term unweighted", "grpo/train/update.py",
             'entropy=cur["entropy"], weight=weights, settings=loss)', 'entropy=cur["entropy"], settings=loss)',
             ("tests/test_async_rollouts.py::test_with_a_teacher_stale_tokens_weigh_the_distillation_term",)),
    Mutation("the fast engine's copy under FSDP2 keeps its first weights", "grpo/rollout/whole.py",
             "self._load(whole_weights(policy, trainable))", "whole_weights(policy, trainable)",
             ("tests/test_distributed.py::test_fast_sampling_under_fsdp2_samples_a_whole_copy_and_trains_the_synced_"
              "generate_run",)),
    Mutation("each process's reward model sees only its own completions", "grpo/train/reward_model.py",
             "samples, texts = [x for p in parts for x in p[0]], [x for p in parts for x in p[1]]", "del parts",
             ("tests/test_distributed.py::test_reward_model_training_on_two_processes_trains_the_one_process_reward_"
              "model",)),
    Mutation("an asynchronous process takes the draw's first groups, not its own", "grpo/train/async_rollouts.py",
             "(i + 1) * g)), rewards[j],", "(i + 1) * g)), rewards[i],",
             ("tests/test_distributed.py::test_async_without_staleness_on_two_processes_is_the_synchronous_run[ddp]",)),
    Mutation("asynchronous draws hear no pass rates", "grpo/train/async_rollouts.py",
             "                self.collector.sampler.observe(rates)", "                pass",
             ("tests/test_async_rollouts.py::test_with_the_samplers_k_zero_is_the_synchronous_run[difficulty]",)),
    Mutation("a resumed asynchronous stream forgets the pass rates it had not heard", "grpo/train/async_queue.py",
             'self.observed = {int(d): list(r) for d, r in state.get("observed", {}).items() if int(d) < self.first}',
             "self.observed = {}",
             ("tests/test_async_rollouts.py::test_the_difficulty_sampler_resumes_with_the_pass_rates_it_had_not_heard_yet",)),
    Mutation("the difficulty sampler's unheard draws are not checkpointed", "grpo/data/difficulty.py",
             'self.pending = [list(x) for x in state.get("pending", [])]', "self.pending = []",
             ("tests/test_async_rollouts.py::test_the_difficulty_sampler_resumes_with_the_pass_rates_it_had_not_heard_yet",)),
    Mutation("asynchronous dynamic-sampling rounds are keyed by their draw", "grpo/train/async_rollouts.py",
             "        if self.filler is None or self.s.max_staleness > 0:\n            return d, 0",
             "        if True:\n            return d, 0",
             ("tests/test_async_rollouts.py::test_with_the_samplers_k_zero_is_the_synchronous_run[dynamic]",)),
    Mutation("an asynchronous slot keeps uninformative groups", "grpo/train/async_queue.py",
             "idx = (informative & free).nonzero()", "idx = free.nonzero()",
             ("tests/test_async_rollouts.py::test_with_the_samplers_k_zero_is_the_synchronous_run[dynamic]",)),
    Mutation("dynamic sampling's admission lets the producer run ahead", "grpo/train/async_rollouts.py",
             "return self.filler.at.latest_slot(made) <= self.version + self.s.max_staleness", "return True",
             ("tests/test_async_rollouts.py::test_dynamic_sampling_at_k_one_trains_informative_groups_within_the_bound",)),
    Mutation("an asynchronous slot is not dealt out over the processes", "grpo/train/async_queue.py",
             "share = kept_share(self.kept, n_kept=self.n_kept, world=self.world,",
             "share = kept_share(self.kept, n_kept=self.n_kept, world=distributed.World(),",
             ("tests/test_distributed.py::test_async_with_both_samplers_on_two_processes_is_the_synchronous_run",)),
    Mutation("the trainer computes while the engine samples", "grpo/train/async_rollouts.py",
             "        if not self.s.turns:\n            return", "        if True:\n            return",
             ("tests/test_async_rollouts.py::test_on_the_cpu_the_engine_samples_and_the_trainer_computes_in_turns[True]",)),
    Mutation("asynchronous draws hear the pass rates of the draw before them", "grpo/train/async_rollouts.py",
             "heard = d - self.stream.lag\n        if heard >= 0:", "heard = d - 1\n        if heard >= 0:",
             ("tests/test_async_rollouts.py::test_at_k_one_each_draw_hears_the_pass_rates_of_the_draw_two_before_it",)),
    Mutation("every group goes to the first vLLM server", "grpo/rollout/vllm/client.py",
             "zip(servers, blocks(todo, len(servers)))", "zip(servers, blocks(todo, 1))", ("tests/test_vllm_servers.py::test_groups_are_spread_over_the_servers_and_a_stopped_one_is_skipped_then_used_again",)),
    Mutation("a vLLM server used again keeps the weights it had", "grpo/rollout/vllm/client.py",
             "            with self._weights_file(self.model) as path:\n                self._send_weights(server, path)",
             "            pass", ("tests/test_vllm_servers.py::test_groups_are_spread_over_the_servers_and_a_stopped_one_is_skipped_then_used_again",)),
    Mutation("async_turns=false is ignored", "grpo/train/settings.py",
             "return cfg.async_rollouts and cfg.async_turns and cpu_alone", "return cfg.async_rollouts and cpu_alone",
             ("tests/test_settings.py::test_the_async_engine_process_takes_every_core_in_turns_else_half_unless_told",)),
    Mutation("a run with async_turns=false takes turns all the same", "grpo/train/settings.py",
             "return cfg.async_rollouts and cfg.async_turns and cpu_alone", "return cfg.async_rollouts and cpu_alone",
             ("tests/test_async_rollouts.py::test_on_the_cpu_the_engine_samples_and_the_trainer_computes_in_turns[False]",)),
    Mutation("a bad vLLM server list is let through", "grpo/config/validate.py",
             "            server_urls(VLLMServerOptions(urls=c.vllm_server_urls))", "            pass",
             ("tests/test_vllm_servers.py::test_a_bad_server_list_is_refused_naming_the_field[127.0.0.1:8000]",)),
    Mutation("with no vLLM server left the error names one", "grpo/rollout/vllm/client.py",
             '"no server answers (" + "; ".join(s.why for s in self.servers) + ")"',
             '"no server answers (" + self.servers[0].why + ")"',
             ("tests/test_vllm_servers.py::test_with_no_server_left_the_call_is_an_engine_error_naming_them",)),
)


def copy_checkout(dest: Path) -> None:
    """The checkout's files (tracked, and untracked ones git does not ignore) copied to ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, listed):
        src = ROOT / name.decode()
        if src.is_file():
            target = dest / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def _pytest(tests: tuple[str, ...], copy: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(copy)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=copy, env=env,
                          capture_output=True, text=True)


def check(m: Mutation, copy: Path) -> tuple[str, str]:
    """('killed' | 'SURVIVED' | 'STALE' | 'BROKEN', detail) for one mutation, applied in ``copy`` and
    undone. Its tests run once unmutated first: a test that fails anyway (BROKEN) proves nothing."""
    path = copy / m.path
    text = path.read_text()
    if text.count(m.old) != 1:
        return "STALE", f"{m.path}: the line to change occurs {text.count(m.old)} times, not once"
    base = _pytest(m.tests, copy)
    if base.returncode != 0:
        return "BROKEN", f"the tests fail without the mutation: {(base.stdout.strip().splitlines() or [''])[-1]}"
    path.write_text(text.replace(m.old, m.new))
    try:
        done = _pytest(m.tests, copy)
    finally:
        path.write_text(text)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode == 1:
        return "killed", last
    if done.returncode == 0:
        return "SURVIVED", last
    return "STALE", f"pytest exit {done.returncode}: {last}"  # not collected, an error: the entry is out of date


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", default="", help="only the mutations whose name holds this text")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if args.k in m.name]
    bad = 0
    with tempfile.TemporaryDirectory(prefix="grpo-mutations-") as tmp:
        copy = Path(tmp)
        copy_checkout(copy)
        for m in chosen:
            start = time.monotonic()
            verdict, detail = check(m, copy)
            bad += verdict != "killed"
            print(f"{verdict:<8} {m.name} ({time.monotonic() - start:.0f} s): {detail}", flush=True)
    print(f"{len(chosen) - bad} of {len(chosen)} mutations killed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
