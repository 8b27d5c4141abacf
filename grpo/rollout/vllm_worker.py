"""The worker extension vLLM loads into its engine process for ``rollout_backend=vllm``
(``LLM(worker_extension_cls=...)``): the trainer's weights arrive as a safetensors file (in shared
memory, /dev/shm, where there is one) whose path comes through ``collective_rpc``; vLLM's RPC
serialises tensors for its own typed messages only."""

from __future__ import annotations


class WeightSync:
    """Mixed into vLLM's worker class; ``self.model_runner`` is the worker's."""

    def load_grpo_weights(self, path: str) -> int:
        """Load the tensors of the safetensors file ``path``, named as in the Hugging Face checkpoint,
        into the engine's model: through the model runner's in-place ``reload_weights``, which runs
        the model's own ``load_weights`` (fusing q/k/v and gate/up as when it loads the folder) and
        then repacks the weights for its kernels again (vLLM's CPU linears keep a packed copy and an
        empty ``weight``), else through ``load_weights`` alone. Returns how many tensors were loaded."""
        from safetensors.torch import load_file

        weights = load_file(path, device="cpu")
        runner = self.model_runner
        if hasattr(runner, "reload_weights"):
            runner.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)
        else:
            runner.model.load_weights(weights=weights.items())
        return len(weights)
