"""Serving a trained policy: ``grpo export``, ``grpo serve`` (an OpenAI-compatible API with the seed's
latency budget and fallback model, seed 003 section 5.3) and ``grpo serve-bench``. Needs the ``serve``
extra (FastAPI, uvicorn, prometheus-client, httpx; openai for its tests).

Every serving engine is an entry of ``grpo.serve.engines.SERVE_ENGINES``; importing the package
registers them all (vLLM's too: its module imports vLLM only when a server starts on it).
"""

from grpo.serve import engines, vllm_lanes  # noqa: F401  (their SERVE_ENGINES entries)
