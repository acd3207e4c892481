"""When failing rewards stop the run (`reward.failures`): a reward that fails is never silent.

A component fails on an item when it raises, overruns its timeout, dies, or returns None, NaN, ±inf or a
non-number (scalerl/rewards/scorer.py); the environment's own score when it returns such a value or its
worker died (scalerl/rewards/pipeline.py). Each such item gets the fallback and counts in
`reward/<name>_failures` (`env` for the environment's score). `FailureWatch` turns the counts into
`reward/failed_share` and stops the run with one line naming the component, the share and its first
failure — at the first step on which a component failed on every item, or after `steps` steps in a row
above `share`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scalerl.config import RewardConfig
from scalerl.errors import RewardsFailing


def first_line(message: str) -> str:
    """The line of an error message or traceback that says what went wrong (a traceback's last line)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return "no message"
    return (lines[-1] if lines[0].startswith("Traceback") else lines[0])[:300]


@dataclass
class FailureWatch:
    config: RewardConfig
    streaks: dict[str, int] = field(default_factory=dict)  # component -> failing steps in a row

    def check(self, step: int, failures: dict[str, float], items: float, first: dict[str, str]) -> float:
        """The largest share of failed items this step (`reward/failed_share`); raises `RewardsFailing` when it is
        time to stop. `failures`: component -> failed items of the step (over every rank); `items`: the step's
        items (over every rank); `first`: component -> its first failure, in words."""
        cfg = self.config.failures
        shares = {name: n / max(items, 1.0) for name, n in failures.items()}
        for name, share in shares.items():
            self.streaks[name] = self.streaks.get(name, 0) + 1 if share > cfg.share else 0
        if not shares:
            return 0.0
        worst = max(shares, key=lambda name: shares[name])
        if cfg.stop_when_all_fail and shares[worst] >= 1.0:
            name, why = worst, "every item"
        elif stuck := [name for name in shares if self.streaks[name] >= cfg.steps]:
            name = stuck[0]
            why = f"more than {cfg.share:.0%} of the items for {self.streaks[name]} steps in a row (reward.failures.steps)"
        else:
            return shares[worst]
        raise RewardsFailing(f"reward component '{name}' failed on {why}: {int(failures[name])} of {int(items)} at step {step}; "
                             f"first failure: {first.get(name, 'not recorded on this rank')}", component=name, share=shares[name])

    def state_dict(self) -> dict[str, int]:
        return dict(self.streaks)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.streaks = dict(state)
