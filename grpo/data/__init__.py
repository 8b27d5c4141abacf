"""Tasks: prompts with gold answers, a held-out split, seeded sampling, chat-template rendering."""

from grpo.data.tasks import Task, fit_prompt, load_task, render_prompt, task_of
from grpo.data.sampler import PromptSampler

__all__ = ["PromptSampler", "Task", "fit_prompt", "load_task", "render_prompt", "task_of"]
