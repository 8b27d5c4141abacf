"""vLLM underneath the rollout: colocated (``colocated.py``), behind ``grpo vllm-serve`` (``server.py``,
its request checks ``requests.py``) and that server's client (``client.py``); what they share
(``rows.py``) and the worker extension vLLM loads (``worker.py``)."""
