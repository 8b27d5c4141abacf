"""``grpo serve`` and ``grpo export``: flags, model loading, the uvicorn server and its drain."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from grpo.errors import ConfigError
from grpo.rewards.reward import RewardOptions
from grpo.infra.http import check_bind
from grpo.serve.scheme import COMPLETENESS_CHECKS, DEFAULT_ENTROPY_THRESHOLD, DEFAULT_MARKERS, Scheme, default_completeness


def parse_markers(values: list[str] | None) -> dict[str, tuple[str, ...]]:
    """``--closing-markers LANG=a,b,c`` (repeatable; a language given replaces its defaults) or 'none'."""
    if not values:
        return dict(DEFAULT_MARKERS)
    if values == ["none"]:
        return {}
    out = dict(DEFAULT_MARKERS)
    for v in values:
        lang, sep, words = v.partition("=")
        if not sep or not lang.strip():
            raise ConfigError(f"--closing-markers: {v!r} is not LANG=word,word (or 'none')")
        out[lang.strip()] = tuple(w.strip() for w in words.split(",") if w.strip())
    return out


def scheme_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("the scheme (seed 003, section 5.3; defaults are the seed's)")
    g.add_argument("--grpo-max-tokens", type=int, default=512, help="cap on the GRPO model's new tokens")
    g.add_argument("--entropy-threshold", type=float, default=DEFAULT_ENTROPY_THRESHOLD,
                   help="early stop: entropy (nats) below which a token counts as certain (the seed names no value)")
    g.add_argument("--entropy-run", type=int, default=3, help="early stop after this many consecutive certain tokens (0 = off)")
    g.add_argument("--deadline", type=float, default=0.8, help="seconds the GRPO model has before the fallback answers")
    g.add_argument("--completeness", default="auto", help="the completeness check: auto (a run: the run's model "
                   "answers a few of its held-out prompts at start-up and the content check most of its answers "
                   "pass is used, final_answer or markers, else ended; without held-out prompts: final_answer for "
                   "a run trained on a reward that reads a final answer, else markers; --closing-markers: markers, "
                   f"--verifier: verifier) or one of {', '.join(COMPLETENESS_CHECKS)}")
    g.add_argument("--closing-markers", action="append", metavar="LANG=a,b",
                   help="completeness: words one of which the answer must contain, per language (repeatable; 'none' = no marker check)")
    g.add_argument("--verifier", help="completeness: a grpo reward (name or module:function) scoring > 0, instead of markers")
    g.add_argument("--fallback", default="base", help="'base' (the run's base model; a plain model: itself) or a model")
    g.add_argument("--fallback-max-tokens", type=int, default=1024, help="cap on the fallback's new tokens")
    g.add_argument("--fallback-note", help="note appended to the fallback's answers (default: per language)")


def completeness_of(args, rewards: str | None) -> str:
    """``--completeness``: auto is derived from the flags given, then from the run's rewards."""
    check = getattr(args, "completeness", "auto") or "auto"
    if check == "auto":
        if args.verifier:
            return "verifier"
        return "markers" if args.closing_markers else default_completeness(rewards)
    COMPLETENESS_CHECKS.lookup(check, also=("auto",))  # an unknown name lists the valid ones
    if check == "verifier" and not args.verifier:
        raise ConfigError("--completeness verifier: needs --verifier NAME")
    return check


def build_scheme(args, rewards: str | None = None, reward_options: RewardOptions = RewardOptions()) -> Scheme:
    """The scheme of the flags; ``rewards``: the served run's reward functions (None: not a run);
    ``reward_options``: how --verifier is resolved (a run's: its reward_* and judge_* fields)."""
    verifier = None
    if args.verifier:
        from grpo.rewards import resolve_reward

        verifier = resolve_reward(args.verifier, reward_options)
    scheme = Scheme(grpo_max_tokens=args.grpo_max_tokens, entropy_threshold=args.entropy_threshold,
                    entropy_run=args.entropy_run, deadline_s=args.deadline, completeness=completeness_of(args, rewards),
                    markers=parse_markers(args.closing_markers), verifier=verifier,
                    fallback_max_tokens=args.fallback_max_tokens)
    if args.fallback_note is not None:
        scheme.notes = {"en": args.fallback_note, "zh": args.fallback_note}
    for name in ("grpo_max_tokens", "fallback_max_tokens"):
        if getattr(scheme, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: must be >= 1")
    if scheme.deadline_s <= 0:
        raise ConfigError("--deadline: must be > 0")
    return scheme


def serve_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="grpo serve", description="Serve a run (or any model) behind an "
                                 "OpenAI-compatible API, with a latency budget and a fallback model.")
    ap.add_argument("model", metavar="RUN_OR_MODEL", help="run folder, model folder, hub id or the embedded default")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only; any other "
                    "needs a key or --insecure)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--api-key", default=os.environ.get("GRPO_SERVE_API_KEY"),
                    help="require 'Authorization: Bearer KEY' on every route, /health and /metrics too "
                         "(default: $GRPO_SERVE_API_KEY; unset: no key)")
    ap.add_argument("--insecure", action="store_true", help="allow a non-loopback --host without a key")
    ap.add_argument("--engine", default="auto", help="auto, fast (grpo's decode step, paged KV cache), hf "
                    "(transformers' forward, any causal LM) or vllm (vLLM's engine; run from vLLM's environment)")
    ap.add_argument("--kernels", default="auto", help="the fast engine's decode_kernels setting")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "auto"),
                    help="the fast engine's weights: float32 (exactly the trained model), bfloat16 (rounded: half the "
                    "bytes a decode step reads, sums in float32), auto (per product, whichever is faster here)")
    ap.add_argument("--max-batch", type=int, default=16, help="rows each model decodes at once (continuous batching: "
                    "a request joins at the next step)")
    ap.add_argument("--max-step-tokens", type=int, default=128, help="tokens one step feeds the model: a token of "
                    "each decoding row, the rest prompt chunks (a long prompt is prefilled over several steps)")
    ap.add_argument("--prefix-cache-tokens", type=int, default=4096, help="prompt tokens whose KV is kept for reuse "
                    "by prompts that begin alike (the chat template's system prompt), per model; 0: off")
    ap.add_argument("--max-queue", type=int, default=64, help="waiting requests per model before 429")
    ap.add_argument("--max-request-bytes", type=int, default=1 << 20)
    ap.add_argument("--max-connections", type=int, default=256, help="requests at once, any route, before 429")
    ap.add_argument("--body-timeout", type=float, default=30.0, help="seconds a request's whole body may take")
    ap.add_argument("--head-timeout", type=float, default=10.0, help="seconds a request's whole head (request line "
                    "and headers) may take, however it trickles in; past it a 408 and the connection is closed")
    ap.add_argument("--max-prompt-tokens", type=int, help="default: the run's max_prompt_length, else 1024")
    ap.add_argument("--max-tokens-limit", type=int, default=1024, help="largest max_tokens a request may ask")
    ap.add_argument("--temperature", type=float, default=0.0, help="when a request gives none (0 = greedy)")
    ap.add_argument("--vllm-option", action="append", default=[], metavar="NAME=VALUE",
                    help="--engine vllm: a vLLM engine argument (repeatable), e.g. gpu_memory_utilization=0.3 (on "
                    "the CPU: the share of the NUMA node's memory for the KV cache)")
    scheme_arguments(ap)
    return ap


def limits_of(args, src) -> "Limits":
    from grpo.serve.protocol import Limits

    return Limits(max_body_bytes=args.max_request_bytes, max_tokens=args.max_tokens_limit,
                  max_prompt_tokens=args.max_prompt_tokens or src.max_prompt_length or 1024,
                  max_requests=args.max_connections, body_timeout_s=args.body_timeout,
                  head_timeout_s=args.head_timeout)


def build_state(args, src=None):
    """Load both models (one when the fallback is the served model itself), their engines, lanes and
    scheduler; warm each lane up once. ``src``: what ``args.model`` names, where the caller read it."""
    from grpo.serve.app import ServerState
    from grpo.serve.batcher import Lane, Scheduler
    from grpo.serve.engines import SERVE_ENGINES, make_serve_engine
    from grpo.serve.models import fallback_source, load_base, load_policy, same_weights, source_of

    src = src or source_of(args.model)
    scheme = build_scheme(args, src.rewards, src.reward_options)
    limits = limits_of(args, src)
    fb_src = fallback_source(src, args.fallback)
    same = same_weights(src, fb_src)
    if hasattr(SERVE_ENGINES.get(args.engine), "build_state"):  # the server over lanes of its own (vLLM's)
        return SERVE_ENGINES[args.engine].build_state(args, src, fb_src, scheme, limits, same=same)
    policy, tok = load_policy(src)
    caps = (scheme.grpo_max_tokens, scheme.fallback_max_tokens)
    kw = dict(kernels=args.kernels, max_rows=args.max_batch * (2 if same else 1))
    options = dict(max_step_tokens=args.max_step_tokens, prefix_pages=max(args.prefix_cache_tokens, 0) // 16,
                   dtype=args.dtype)
    engine = make_serve_engine(args.engine, policy, tok, max_len=limits.max_prompt_tokens + (max(caps) if same else
                               caps[0]), options=options, **kw)
    if same:
        fb_engine = engine
    else:
        base, base_tok = load_base(fb_src) if args.fallback == "base" else load_policy(fb_src)
        fb_engine = make_serve_engine(args.engine, base, base_tok, max_len=limits.max_prompt_tokens + caps[1],
                                      options=options, **kw)
    grpo = Lane(engine, name="grpo", max_rows=args.max_batch, max_queue=args.max_queue,
                entropy_threshold=scheme.entropy_threshold, entropy_run=scheme.entropy_run)
    fallback = Lane(fb_engine, name="base", max_rows=args.max_batch, max_queue=args.max_queue)
    scheduler = Scheduler([grpo, fallback])
    for lane in (grpo, fallback):  # the first steps pay one-off costs (memory, the step-time estimate)
        for f in [lane.submit("Hello", cap=4, deadline=None) for _ in range(min(args.max_batch, 4))]:
            f.result()
    return ServerState(grpo=grpo, fallback=fallback, scheme=scheme, limits=limits, api_key=args.api_key or None,
                       system_prompt=src.system_prompt, default_temperature=args.temperature, noted=not same,
                       scheduler=scheduler)


def measure_completeness(state, args, src) -> str | None:
    """``--completeness auto`` on a run with held-out prompts: the GRPO model answers them once (greedy,
    the scheme's cap, no deadline) and the check its own answers pass is put on the scheme
    (``choose_completeness``); returns the line saying which and why (None: nothing was measured, the
    check stays the one the flags and the run's rewards give)."""
    from grpo.data import render_prompt
    from grpo.serve.models import probe_prompts_of
    from grpo.serve.scheme import choose_completeness

    asked = getattr(args, "completeness", "auto") or "auto"
    if asked != "auto" or args.verifier or args.closing_markers:
        return None
    prompts = probe_prompts_of(src)
    if not prompts:
        return None
    tok = state.grpo.engine.tokenizer
    futures = [state.grpo.submit(render_prompt(tok, p, src.system_prompt), cap=state.scheme.grpo_max_tokens,
                                 deadline=None) for p in prompts]
    gens = [f.result() for f in futures]
    samples = [{"prompt": p, "answer": None} for p in prompts]
    choice = choose_completeness(gens, samples, state.scheme, default_completeness(src.rewards))
    state.scheme.completeness = choice.name
    return choice.describe()


def make_server(state, *, host: str, port: int, drain_s: float = 60.0):
    """A uvicorn server of the app whose SIGTERM/SIGINT first marks the state draining: it keeps
    listening, answers every new request (on a kept-alive connection too) with a 503, and once the
    requests in flight are answered (at most ``drain_s`` seconds) uvicorn stops and the batchers with
    it. A second SIGINT stops at once."""
    import threading

    import uvicorn

    from grpo.serve.app import JsonErrorH11, create_app

    def stop_batchers():
        if state.scheduler is not None:
            state.scheduler.stop()

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if state.draining:  # a second signal: uvicorn's own (SIGINT forces the exit)
                return super().handle_exit(sig, frame)
            state.draining = True
            self._captured_signals.append(sig)
            threading.Thread(target=self._exit_when_drained, daemon=True).start()

        def _exit_when_drained(self):
            end = time.monotonic() + drain_s
            while state.in_flight > 0 and time.monotonic() < end:
                time.sleep(0.02)
            self.should_exit = True

    config = uvicorn.Config(create_app(state, on_shutdown=stop_batchers), host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=drain_s, access_log=False,
                            http=type("JsonErrorH11", (JsonErrorH11,), {"head_timeout_s": state.limits.head_timeout_s}))
    return DrainingServer(config)


def serve_main(argv: list[str]) -> int:
    args = serve_parser().parse_args(argv)
    check_bind(args.host, args.api_key, insecure=args.insecure, env="GRPO_SERVE_API_KEY")  # before the models load
    for name in ("max_connections", "max_request_bytes", "max_batch", "max_step_tokens"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: must be >= 1")
    if args.body_timeout <= 0 or args.head_timeout <= 0:
        raise ConfigError("--body-timeout, --head-timeout: must be > 0")
    from grpo.serve.models import source_of

    src = source_of(args.model)  # read once: the state's models and the completeness measurement
    state = build_state(args, src)
    measured = measure_completeness(state, args, src)
    if measured:
        print(f"grpo serve: {measured}", file=sys.stderr, flush=True)
    from grpo.rollout.tuning import take_messages

    for message in take_messages():  # the decode products the fast engine measured or read, with the CPU
        print(f"grpo serve: {message}", file=sys.stderr, flush=True)
    server = make_server(state, host=args.host, port=args.port)
    print(f"grpo serve: {args.model} (fallback: {args.fallback}) on http://{args.host}:{args.port} "
          f"(engine {state.grpo.engine.name}; completeness check {state.scheme.completeness}; models: grpo, base"
          f"{'; key required' if state.api_key else ''})",
          flush=True)
    for sig in (signal.SIGTERM, signal.SIGINT):  # uvicorn raises the signal it caught again once drained:
        signal.signal(sig, lambda *a: None)  # by then there is nothing left to stop, so exit normally
    server.run()
    print("grpo serve: drained and stopped", flush=True)
    return 0


def export_main(argv: list[str]) -> int:
    from grpo.serve.gguf_export import QUANTS
    from grpo.serve.models import EXPORT_FORMATS, export

    ap = argparse.ArgumentParser(prog="grpo export", description="Write a run's newest checkpoint (LoRA adapters "
                                 "merged into the weights) with a model card: a plain transformers model folder, or "
                                 "one GGUF file for llama.cpp and Ollama with a Modelfile beside it.")
    ap.add_argument("model", metavar="RUN_OR_MODEL")
    ap.add_argument("--out", required=True, type=Path, help="folder to write (must not exist or be empty)")
    ap.add_argument("--format", default="transformers", choices=EXPORT_FORMATS, help="transformers (default) or gguf")
    ap.add_argument("--quant", default="f16", choices=QUANTS, help="--format gguf: the matrices' type (f16 default)")
    ap.add_argument("--gguf-pre", default=None, help="--format gguf: llama.cpp's pre-tokenizer name (default: read "
                    "from the tokenizer: gpt-2 or smollm; another tokenizer needs it named)")
    args = ap.parse_args(argv)
    out = export(args.model, args.out, fmt=args.format, quant=args.quant, pre=args.gguf_pre)
    print(f"exported {args.model} to {out}")
    return 0
