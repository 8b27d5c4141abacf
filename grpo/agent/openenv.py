"""OpenEnv environments over their own protocol: ``environment_factory=openenv:http://HOST:PORT``.

An OpenEnv server (Meta / Hugging Face OpenEnv: an ``Environment`` with ``reset`` / ``step`` served by
``openenv.core.env_server.create_app``, started locally as a process or a container) holds one
environment instance per WebSocket session at ``/ws``. Each episode here is one session: ``reset``
opens it and sends ``{"type": "reset"}`` (with the row's ``seed`` and the fields of its
``openenv_reset`` mapping, where present), and its observation is the text appended to the prompt;
the model acts through one tool, ``step``, whose arguments are the server's action schema
(``GET /schema``), each call one ``{"type": "step"}`` message whose observation is the tool's result;
the rewards of the steps add up to the episode's reward (the built-in reward ``environment``). Once
the server says ``done``, a further step is answered as an error. The session closes when the episode
is scored. Every exchange has a deadline (``OPENENV_TIMEOUT`` seconds; a step also the run's
``tool_timeout``). The client needs the ``websockets`` package.
"""

from __future__ import annotations

import importlib.util
import json
import threading
import urllib.request

from grpo.agent.tools import Tool
from grpo.errors import ConfigError

OPENENV_TIMEOUT = 30.0  # seconds for opening a session, a reset, the schema
PREFIX = "openenv:"
_META = ("metadata",)  # fields of OpenEnv's base Action / Observation that are not the environment's own


def is_openenv(spec: str) -> bool:
    return spec.strip().startswith(PREFIX)


def _observation_text(obs: dict) -> str:
    """An observation's own fields as text: a single text field as it is, else ``name: value`` lines."""
    own = {k: v for k, v in obs.items() if k not in ("done", "reward", *_META) and v not in ("", None)}
    if len(own) == 1 and isinstance(next(iter(own.values())), str):
        return next(iter(own.values()))
    return "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v)}" for k, v in own.items())


class OpenEnvSession:
    """One episode's session with an OpenEnv server (a TRL-form environment: ``reset``, tools, ``get_reward``)."""

    def __init__(self, url: str, step_schema: dict):
        self.url, self.step_schema = url.rstrip("/"), step_schema
        self.ws = None
        self.stepping = threading.Lock()  # a step abandoned at its deadline still holds it: the session is spent
        self.rewards: list[float] = []
        self.done = False

    def _exchange(self, message: dict, timeout: float) -> dict:
        from websockets.exceptions import ConnectionClosed

        try:
            self.ws.send(json.dumps(message))
            reply = json.loads(self.ws.recv(timeout=timeout))
        except (ConnectionClosed, TimeoutError) as e:  # the server closed the session (at capacity) or went quiet
            raise RuntimeError(f"the session closed or did not answer ({type(e).__name__}: {e})") from None
        if reply.get("type") == "error":
            data = reply.get("data") or {}
            raise RuntimeError(f"{data.get('code', 'error')}: {data.get('message', reply)}")
        return reply.get("data") or {}

    def reset(self, **row) -> str:
        """Open the session and reset the environment; its first observation's text."""
        from websockets.sync.client import connect

        ws_url = "ws" + self.url[len("http"):] + "/ws"
        try:
            # entered as a context manager (how websockets wants a connection held), left in close()
            self.ws = connect(ws_url, open_timeout=OPENENV_TIMEOUT, close_timeout=5).__enter__()
        except Exception as e:  # noqa: BLE001  refused, unreachable, not a WebSocket server
            raise ConfigError(f"environment_factory: cannot open an OpenEnv session at {ws_url} "
                              f"({type(e).__name__}: {e})") from None
        data = {**({"seed": row["seed"]} if "seed" in row else {}), **dict(row.get("openenv_reset") or {})}
        try:
            out = self._exchange({"type": "reset", "data": data}, OPENENV_TIMEOUT)
        except RuntimeError as e:
            self.close()
            raise ConfigError(f"environment_factory: the OpenEnv server at {self.url} refused a reset ({e}); a server "
                              "holds max_concurrent_envs sessions and a step opens one per episode at once "
                              "(prompts_per_step * num_generations; an evaluation its prompts times eval_pass_k)") \
                from None
        return _observation_text(out.get("observation") or {})

    def step(self, **action) -> str:
        if self.done:
            raise RuntimeError("the episode has ended; give the final answer")
        if not self.stepping.acquire(blocking=False):  # the last step passed its deadline and still waits
            self.done = True
            raise RuntimeError("the environment did not answer the last step in time; the episode has ended")
        try:
            out = self._exchange({"type": "step", "data": action}, OPENENV_TIMEOUT)
        finally:
            self.stepping.release()
        if out.get("reward") is not None:
            self.rewards.append(float(out["reward"]))
        self.done = bool(out.get("done"))
        text = _observation_text(out.get("observation") or {})
        return text + ("\n(the episode has ended)" if self.done else "")

    def described_tools(self) -> list[Tool]:
        """The one tool, ``step``, described by the server's action schema."""
        return [Tool(name="step", fn=self.step, schema=self.step_schema, is_async=False)]

    def get_reward(self) -> float:
        """The sum of the rewards the steps returned (0 when none did); closes the session."""
        self.close()
        return float(sum(self.rewards))

    def close(self) -> None:
        if self.ws is not None:
            try:
                self.ws.send(json.dumps({"type": "close"}))
                self.ws.close()
            except Exception:  # noqa: BLE001  the server is gone already
                pass
            self.ws = None

    def __del__(self):
        self.close()


def step_schema(url: str) -> dict:
    """The ``step`` tool's schema from the server's action schema (``GET /schema``)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/schema", timeout=OPENENV_TIMEOUT) as r:
            schema = json.loads(r.read())
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"environment_factory: no OpenEnv server answers at {url} ({type(e).__name__}: {e})") from None
    action = schema.get("action") if isinstance(schema, dict) else None
    if not isinstance(action, dict):
        raise ConfigError(f"environment_factory: {url}/schema has no action schema (is it an OpenEnv server?)")
    props = {k: v for k, v in action.get("properties", {}).items() if k not in _META}
    params = {"type": "object", "properties": props, "required": [k for k in action.get("required", []) if k in props]}
    description = action.get("description") or f"Act in the environment ({action.get('title', 'action')})."
    return {"type": "function", "function": {"name": "step", "description": description, "parameters": params}}


def openenv_factory(spec: str):
    """``openenv:URL`` as a factory of sessions (the schema read once, here)."""
    url = spec.strip()[len(PREFIX):]
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"environment_factory: {spec!r}: give the server as openenv:http://HOST:PORT")
    if importlib.util.find_spec("websockets") is None:
        raise ConfigError("environment_factory: an OpenEnv server needs the websockets package "
                          "(pip install -e '.[envs]')")
    schema = step_schema(url)
    return lambda: OpenEnvSession(url, schema)
