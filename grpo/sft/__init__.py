"""Supervised fine-tuning (``grpo sft``): chat and prompt/completion data with the loss on the
assistant's tokens, on grpo train's model loading, optimizer, torchrun, checkpoints and run folder."""

from grpo.sft.data import SFTExample, encode_row, load_examples, read_rows
from grpo.sft.settings import SFTModelSettings, SFTSettings
from grpo.sft.trainer import SFTRun

__all__ = ["SFTExample", "SFTModelSettings", "SFTRun", "SFTSettings", "encode_row", "load_examples", "read_rows"]
