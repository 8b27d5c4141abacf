"""The comparison's two figures: learning curves (mean and spread over seeds) and one held-out trajectory."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _running(curve: list[tuple[int, float]], grid: np.ndarray, window: int) -> np.ndarray:
    """Running mean of the last ``window`` episode returns, read at each env-step count of ``grid``."""
    if not curve:
        return np.full(len(grid), np.nan)
    steps = np.array([s for s, _ in curve])
    rets = np.array([r for _, r in curve])
    csum = np.concatenate([[0.0], np.cumsum(rets)])
    out = np.full(len(grid), np.nan)
    for j, g in enumerate(grid):
        k = int(np.searchsorted(steps, g, side="right"))  # episodes finished by step g
        if k:
            lo = max(0, k - window)
            out[j] = (csum[k] - csum[lo]) / (k - lo)
    return out


def plot_curves(results, path: Path, *, threshold: float, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budget = max(r.env_steps for r in results)
    grid = np.linspace(budget / 50, budget, 50)
    fig, ax = plt.subplots(figsize=(8, 5))
    for algo in dict.fromkeys(r.algo for r in results):
        ys = np.stack([_running(r.curve, grid, window) for r in results if r.algo == algo])
        mean, std = np.nanmean(ys, 0), np.nanstd(ys, 0)
        ax.plot(grid, mean, label=f"{algo} ({len(ys)} seeds)")
        ax.fill_between(grid, mean - std, mean + std, alpha=0.2)
    ax.axhline(threshold, color="grey", ls="--", lw=0.8, label=f"threshold {threshold:g}")
    ax.set_xlabel("environment steps")
    ax.set_ylabel(f"training episode return (running mean of {window})")
    ax.set_title("grpo/PathTracking-v0: learning curves (mean ± std over seeds)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_trajectories(results, base, path: Path, *, scenario: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from grpo.pathtracking.paths import held_out_scenarios

    sc = held_out_scenarios()[scenario]
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot(sc.path.x, sc.path.y, color="black", lw=2, label=f"reference ({sc.path.family})")
    first = {}
    for r in results:
        first.setdefault(r.algo, r)
    for algo, r in first.items():
        xy = np.array(r.trajectory)
        ax.plot(xy[:, 0], xy[:, 1], lw=1, label=f"{algo} (seed {r.seed})")
    xy = np.array(base.trajectory)
    ax.plot(xy[:, 0], xy[:, 1], lw=1, ls="--", label="proportional")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_title(f"held-out scenario {scenario}: start offset {sc.lateral:+.1f} m, {sc.heading:+.2f} rad")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
