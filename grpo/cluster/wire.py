"""Tensors as Ray moves them: numpy arrays, which the object store hands to a reader without a copy
(a torch tensor would be pickled). bfloat16 has no numpy dtype: its bits travel as int16."""

from __future__ import annotations

import warnings

import numpy as np
import torch


def to_wire(weights: dict[str, torch.Tensor]) -> dict[str, tuple[str, np.ndarray]]:
    """Each tensor as (its torch dtype's name, a numpy array of its bits)."""
    out = {}
    for name, t in weights.items():
        t = t.detach().cpu().contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        out[name] = (dtype, (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy())
    return out


def from_wire(wire: dict[str, tuple[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """``to_wire``'s tensors back (views of the arrays: copy them before the arrays go)."""
    out = {}
    for name, (dtype, a) in wire.items():
        t = readonly_tensor(a)
        out[name] = t.view(torch.bfloat16) if dtype == "bfloat16" else t
    return out


def wire_bytes(wire: dict[str, tuple[str, np.ndarray]]) -> int:
    return sum(int(a.nbytes) for _, a in wire.values())


def readonly_tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor on an array the object store handed over read-only, for reading (torch warns that it
    cannot protect such memory from writes; nothing here writes to it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.asarray(a))
