"""Learning curves of a run: success vs online env steps, with and without search, and the offline start.

`curves.json` holds {"env_steps": [...], "success": [...], "success_no_search": [...],
"offline_success_rate": x, "offline_steps": [...], "offline_success": [...]}, lists aligned by index
(success_no_search is null where a run without search has no second actor; the offline lists are the
policy alone every `budget.offline_eval_every` gradient steps, empty when that is 0); `curves.png` draws
them, the offline curve in a panel of its own. Both are rewritten after every evaluation, so a crashed
run keeps its curve; a resumed run drops the points after its checkpoint first.
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on training machines
import matplotlib.pyplot as plt  # noqa: E402

from robo_rl.utils.logging import write_json  # noqa: E402


ONLINE_KEYS = ("env_steps", "success", "success_no_search")
OFFLINE_KEYS = ("offline_steps", "offline_success")


class LearningCurve:
    """resume_env_steps / resume_offline_step: the counters of the checkpoint a resumed run starts from;
    no_search_actor: what acts without search, as the plot names it ("policy", or "critic best-of-8" for a run
    acting with agent.best_of_n=8); title: the figure's (task, budget, run)."""

    def __init__(self, run_dir: str | Path, resume_env_steps: int | None = None, resume_offline_step: int = 0,
                 no_search_actor: str = "policy", title: str = ""):
        self.no_search_actor, self.title = no_search_actor, title
        self.json_path, self.png_path = Path(run_dir) / "curves.json", Path(run_dir) / "curves.png"
        self.data = {**{k: [] for k in ONLINE_KEYS}, "offline_success_rate": None, **{k: [] for k in OFFLINE_KEYS}}
        if resume_env_steps is not None and self.json_path.exists():
            old = json.loads(self.json_path.read_text())
            self.data["offline_success_rate"] = old["offline_success_rate"]
            for keys, counter, done in ((ONLINE_KEYS, "env_steps", resume_env_steps),
                                        (OFFLINE_KEYS, "offline_steps", resume_offline_step)):
                keep = [i for i, s in enumerate(old.get(counter, [])) if s <= done]
                self.data |= {k: [old[k][i] for i in keep] for k in keys}

    def set_offline(self, success_rate: float) -> None:
        self.data["offline_success_rate"] = success_rate
        self._write()

    def add(self, env_steps: int, success: float, success_no_search: float | None = None) -> None:
        """A point at env_steps; one already there (a periodic evaluation at the last step) is replaced."""
        if self.data["env_steps"] and self.data["env_steps"][-1] == env_steps:
            for key in ONLINE_KEYS:
                self.data[key].pop()
        for key, value in zip(ONLINE_KEYS, (env_steps, success, success_no_search)):
            self.data[key].append(value)
        self._write()

    def add_offline(self, offline_step: int, success: float) -> None:
        """The policy alone after `offline_step` gradient steps on the demonstrations."""
        self.data["offline_steps"].append(offline_step)
        self.data["offline_success"].append(success)
        self._write()

    def _write(self) -> None:
        write_json(self.json_path, self.data)
        fig = self.figure()
        fig.savefig(self.png_path, dpi=100)
        plt.close(fig)

    def figure(self) -> plt.Figure:
        """The curves as curves.png draws them (the offline curve, when there is one, in a panel of its own)."""
        offline_curve = bool(self.data["offline_steps"])
        fig, axes = plt.subplots(1, 1 + offline_curve, figsize=(6 + 4 * offline_curve, 4), squeeze=False)
        if offline_curve:  # where pretraining peaked or fell off: the online curve starts from its end
            ax = axes[0, 0]
            ax.plot(self.data["offline_steps"], self.data["offline_success"], "o-", color="tab:green")
            ax.set(xlabel="offline gradient steps", ylabel=f"success rate ({self.no_search_actor})", ylim=(-0.02, 1.02))
            ax.grid(alpha=0.3)
        ax = axes[0, -1]
        steps = self.data["env_steps"]
        no_search = [(s, v) for s, v in zip(steps, self.data["success_no_search"]) if v is not None]
        start = self.data["offline_success_rate"]
        if start is not None:  # the online curves start where pretraining left the policy: a point at 0 steps
            ax.axhline(start, color="gray", ls=":", lw=1)
            ax.plot([0], [start], "*", color="gray", ms=12, label=f"offline start ({start:.2f})")
        # hollow circles around filled squares: equal values stay visible as two markers
        ax.plot(steps, self.data["success"], "o-", ms=11, mfc="none", mew=2,
                label="with search" if no_search else self.no_search_actor)
        if no_search:
            ax.plot(*zip(*no_search), "s--", ms=5, label=f"without search ({self.no_search_actor})")
        ax.set(xlabel="online env steps", ylabel="success rate", ylim=(-0.04, 1.04),
               xlim=(-0.04 * max(steps or [1]), 1.04 * max(steps or [1])))
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
        if self.title:
            fig.suptitle(self.title, fontsize=10)
        fig.tight_layout()
        return fig
