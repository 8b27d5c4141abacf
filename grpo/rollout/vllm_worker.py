"""The worker extension vLLM loads into its engine process for ``rollout_backend=vllm``
(``LLM(worker_extension_cls=...)``): the trainer's weights arrive through ``collective_rpc``."""

from __future__ import annotations


class WeightSync:
    """Mixed into vLLM's worker class; ``self.model_runner`` is the worker's."""

    def load_grpo_weights(self, weights: list) -> int:
        """Load (name, tensor) pairs, named as in the Hugging Face checkpoint, through the model's own
        ``load_weights`` (which fuses q/k/v and gate/up as it does when loading the folder). Returns
        how many tensors were given."""
        self.model_runner.model.load_weights(weights=weights)
        return len(weights)
