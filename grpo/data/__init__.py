"""Tasks: prompts with gold answers, a held-out split, seeded sampling, chat-template rendering."""

from grpo.data.tasks import Task, TaskLoading, fit_prompt, load_task, render_prompt
from grpo.data.sampler import PromptSampler

__all__ = ["PromptSampler", "Task", "TaskLoading", "fit_prompt", "load_task", "render_prompt"]
