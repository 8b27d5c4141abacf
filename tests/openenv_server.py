"""An OpenEnv environment served the way OpenEnv serves one (``openenv.core.env_server.create_app``),
started by tests/test_openenv.py as a process: guess a number from 1 to 100 (two guesses), each rewarded by
its closeness.

    python -m uvicorn tests.openenv_server:app --host 127.0.0.1 --port PORT
"""

from __future__ import annotations

import random
from typing import Any, Optional

from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field


class GuessAction(Action):
    """Guess the secret number."""

    guess: int = Field(..., description="your guess, from 1 to 100")


class GuessObservation(Observation):
    prompt: str = ""
    feedback: str = ""


class GuessState(State):
    secret: int = 0


class GuessEnvironment(Environment[GuessAction, GuessObservation, GuessState]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = GuessState(episode_id="", step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        self._state = GuessState(episode_id=episode_id or "e", step_count=0, secret=random.Random(seed).randint(1, 100))
        return GuessObservation(prompt=" Guess my number between 1 and 100.", done=False, reward=None)

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        secret = self._state.secret
        feedback = "correct" if action.guess == secret else "too low" if action.guess < secret else "too high"
        done = action.guess == secret or self._state.step_count >= 2  # two guesses at most
        return GuessObservation(feedback=feedback, done=done, reward=1.0 - abs(action.guess - secret) / 100)

    @property
    def state(self) -> GuessState:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=64)
