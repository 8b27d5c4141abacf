"""The worker extension vLLM loads into its engine process for ``rollout_engine=vllm``
(``LLM(worker_extension_cls=...)``): the trainer's weights arrive as a safetensors file (in shared
memory, /dev/shm, where there is one) whose path comes through ``collective_rpc``; vLLM's RPC
serialises tensors for its own typed messages only."""

from __future__ import annotations

import os

# the trainer's pid, set by the vllm engine before it starts vLLM: the processes vLLM spawns for it
# (not the trainer itself, where vLLM loads its plugins too) die with their parent
PARENT_ENV = "GRPO_VLLM_DIE_WITH_PARENT"


def die_with_parent_plugin() -> None:
    """vLLM general plugin (entry point ``vllm.general_plugins``, run in each process vLLM starts):
    in the engine core and worker processes of a grpo run (PARENT_ENV set), have the kernel kill the
    process when its parent ends, so a trainer killed outright (SIGKILL, the OOM killer) leaves no
    engine behind (grpo.infra.processes). Other uses of vLLM in the environment are left alone."""
    trainer = os.environ.get(PARENT_ENV)
    if trainer and trainer != str(os.getpid()) and os.getppid() != 1:
        from grpo.infra.processes import die_with_parent

        die_with_parent(os.getppid())


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
        _retie_output_layer(runner.model)
        return len(weights)


def _retie_output_layer(model) -> None:
    """A model whose output layer shares the embeddings (tie_word_embeddings) gets them back after
    the reload: the in-place reload gives the embedding layer a new weight tensor, and the output
    layer would keep the old one and its packed copy (vLLM's CPU kernels pack it once, found by the
    weight-sync test: every weight but the embeddings followed)."""
    lm = getattr(model, "lm_head", None)
    emb = getattr(getattr(model, "model", None), "embed_tokens", None)
    config = getattr(model, "config", None)
    if lm is None or emb is None or not getattr(config, "tie_word_embeddings", False):
        return
    if lm.weight is not emb.weight:
        lm.weight = emb.weight
    method = getattr(lm, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(lm)  # repack the output layer's kernel copy
