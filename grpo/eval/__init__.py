"""Evaluation: greedy accuracy and pass@k on held-out prompts, and the consistency probe."""
