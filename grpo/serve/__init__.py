"""Serving a trained policy: ``grpo export``, ``grpo serve`` (an OpenAI-compatible API with the seed's
latency budget and fallback model, seed 003 section 5.3) and ``grpo serve-bench``. Needs the ``serve``
extra (FastAPI, uvicorn, prometheus-client, httpx; openai for its tests)."""
