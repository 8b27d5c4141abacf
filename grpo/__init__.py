"""grpo: Group Relative Policy Optimization for language models."""

__version__ = "0.1.0"
