"""Models: loading (hub id, local folder, run folder, the embedded default), precision, packing of
sequences into model input, log-probs of completions, and grouped attention."""

from grpo.models.loading import (DEFAULT_MODEL, LoadedModels, freeze, load_models, load_tokenizer,
                                 resolve_model_path, reset_reference)
from grpo.models.precision import keep_head_fp32, native_bf16

__all__ = ["DEFAULT_MODEL", "LoadedModels", "freeze", "keep_head_fp32", "load_models", "load_tokenizer",
           "native_bf16", "reset_reference", "resolve_model_path"]
