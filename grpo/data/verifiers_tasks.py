"""A verifiers environment's taskset as a grpo task (``task=verifiers:<environment id>``): its prompts as chat
messages (the system prompt first, as verifiers' tool-less harness sends them), its answers, its task data
as ``info``, and each task's stable key (``verifiers_key``) by which grpo.agent.verifiers_env finds the task
again to run its episodes. Imports verifiers (0.4, its v1 API): grpo imports this module only for such a task.
"""

from __future__ import annotations

import verifiers.v1 as vf
from pydantic import TypeAdapter

from grpo.errors import ConfigError, DataError

PREFIX = "verifiers:"
_MESSAGE = TypeAdapter(vf.Message)
_BASE_DATA_FIELDS = set(vf.TaskData.model_fields)


def to_wire(message: vf.Message) -> dict:
    """Typed verifiers message -> OpenAI chat dict (text content stays a str)."""
    return message.model_dump(mode="json", exclude_none=True)


def message_list(messages: str | list | None) -> list[vf.Message]:
    if messages is None:
        return []
    if isinstance(messages, str):
        return [vf.UserMessage(content=messages)]
    return [_MESSAGE.validate_python(m) if isinstance(m, dict) else m for m in messages]


def prompt_messages(data: vf.TaskData) -> list[vf.Message]:
    """What the `null` harness sends on its first call: system prompt (own message),
    then the prompt (str -> one user message; Messages as given)."""
    system = [vf.SystemMessage(content=data.system_prompt)] if data.system_prompt else []
    return system + message_list(data.prompt)


def _env_of(env_id: str, env_config: dict | None = None, **taskset_args) -> vf.Env:
    """`env_id` is a taskset id (the env is the one the taskset exports, else
    SingleAgentEnv); `taskset_args` are taskset config fields; `env_config` holds
    env-level fields (e.g. {"max_rounds": 4, "agent": {"max_turns": 6}})."""
    raw = dict(env_config or {})
    raw["taskset"] = {**raw.get("taskset", {}), "id": env_id, **taskset_args}
    return vf.load_environment(vf.resolve_env_config(raw))


def _extra_info(data: vf.TaskData) -> dict:
    dumped = data.model_dump(mode="json")
    info = dict(dumped.get("info") or {}) if isinstance(dumped.get("info"), dict) else {}
    info.update({k: v for k, v in dumped.items() if k not in _BASE_DATA_FIELDS | {"info", "answer"}})
    return info


def env_id_of(spec: str) -> str:
    """The environment id of ``verifiers:<id>``."""
    env_id = spec.strip()[len(PREFIX):].strip()
    if not env_id:
        raise ConfigError(f"task: {spec!r}: name the environment, verifiers:<environment id>")
    return env_id


def load_verifiers_env(env_id: str) -> vf.Env:
    """The environment ``env_id`` names (its module imported by verifiers), or a ConfigError naming it."""
    try:
        return _env_of(env_id)
    except Exception as e:  # not installed, not importable, not a verifiers environment
        raise ConfigError(f"task: the verifiers environment {env_id!r} cannot be loaded ({type(e).__name__}: {e}); "
                          "install it (or put its module on the path): verifiers imports the module named as the "
                          "id with dashes as underscores") from None


def verifiers_rows(spec: str) -> list[dict]:
    """The environment's tasks as dataset rows: "prompt" (chat messages, the system prompt first), "answer"
    ('' where the task has none), "info" and "verifiers_key" (the task's stable key, which finds it again)."""
    env = load_verifiers_env(env_id_of(spec))
    rows = []
    for task in env.taskset:
        answer = getattr(task.data, "answer", None)
        rows.append({"prompt": [to_wire(m) for m in prompt_messages(task.data)],
                     "answer": "" if answer is None else str(answer), "info": _extra_info(task.data),
                     "verifiers_key": task.key})
    if not rows:
        raise DataError(f"task: the verifiers environment {spec!r} has no tasks")
    return rows
