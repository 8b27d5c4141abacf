"""The seed's networks (section 9.2): PolicyNet 128 -> 64 -> actions with LayerNorm and ReLU, and a
value network of the same body for PPO and TRPO. The policy is saved alone (section 9.7).

Dimension letters: N observations, A actions, D observation size.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from torch import Tensor, nn

from grpo.errors import CheckpointError


def _body(obs_dim: int) -> nn.Sequential:
    """Linear(D, 128) -> LayerNorm -> ReLU -> Linear(128, 64) -> LayerNorm -> ReLU."""
    return nn.Sequential(nn.Linear(obs_dim, 128), nn.LayerNorm(128), nn.ReLU(),
                         nn.Linear(128, 64), nn.LayerNorm(64), nn.ReLU())


class PolicyNet(nn.Module):
    """Observations [N, D] -> action logits [N, A]."""

    def __init__(self, obs_dim: int = 2, n_actions: int = 17):
        super().__init__()
        self.obs_dim, self.n_actions = obs_dim, n_actions
        self.body = _body(obs_dim)
        self.head = nn.Linear(64, n_actions)
        # a small last layer: the first policy is close to uniform (as in SB3 and most PPO codes)
        nn.init.orthogonal_(self.head.weight, gain=0.01)
        nn.init.zeros_(self.head.bias)

    def forward(self, obs: Tensor) -> Tensor:
        return self.head(self.body(obs))  # [N, A]

    def dist(self, obs: Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self(obs))

    @torch.no_grad()
    def act(self, obs: Tensor, *, greedy: bool = False, generator: torch.Generator | None = None) -> Tensor:
        """Actions [N] for observations [N, D]: sampled, or the most likely with ``greedy``."""
        logits = self(obs)  # [N, A]
        if greedy:
            return logits.argmax(-1)
        return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)[:, 0]


class ValueNet(nn.Module):
    """Observations [N, D] -> state values [N] (PPO's and TRPO's critic; GRPO has none)."""

    def __init__(self, obs_dim: int = 2):
        super().__init__()
        self.body = _body(obs_dim)
        self.head = nn.Linear(64, 1)

    def forward(self, obs: Tensor) -> Tensor:
        return self.head(self.body(obs))[..., 0]  # [N]


def n_params(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def save_policy(policy: PolicyNet, path: str | Path, *, algo: str) -> Path:
    """Write the policy's weights alone (no value network, no optimizer), with its shape and algorithm."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": policy.state_dict(), "obs_dim": policy.obs_dim, "n_actions": policy.n_actions,
                "algo": algo}, path)
    return path


def load_policy(path: str | Path) -> PolicyNet:
    """A PolicyNet from ``save_policy``'s file; a missing or foreign file is a CheckpointError naming it."""
    path = Path(path)
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        policy = PolicyNet(blob["obs_dim"], blob["n_actions"])
        policy.load_state_dict(blob["state_dict"])
    except (OSError, EOFError, KeyError, RuntimeError, TypeError, pickle.UnpicklingError) as e:
        raise CheckpointError(f"{path}: not a saved control policy ({e})") from None
    return policy.eval()
