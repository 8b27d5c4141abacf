"""Tasks: prompts with gold answers, a held-out split, seeded sampling, chat-template rendering."""

from grpo.data.tasks import Task, load_task, render_prompt, task_of
from grpo.data.sampler import PromptSampler

__all__ = ["PromptSampler", "Task", "load_task", "render_prompt", "task_of"]
