"""Rewards and environments whose scores are bad (tests/reliability is on sys.path): `bad_scores:raises`,
`bad_scores:mostly_nan`, `env.name=bad_scores:NaNEnv`, `bad_scores:WordEnv`, `bad_scores:QuarterNaNEnv`."""

from scalerl.envs.arithmetic import ArithmeticEnv


def raises(prompts, completions, **kwargs):
    return [1.0 / 0 for _ in completions]


def mostly_nan(prompts, completions, **kwargs):
    """NaN for three completions of four: past the default share (0.5) every step."""
    return [float("nan") if i % 4 else 1.0 for i in range(len(completions))]


class NaNEnv(ArithmeticEnv):
    def score(self, task, completion):
        return float("nan")


class WordEnv(ArithmeticEnv):
    def score(self, task, completion):
        return "correct"


class QuarterNaNEnv(ArithmeticEnv):
    """NaN for every fourth item scored (in the trainer's process: reward.num_workers 0); the others as arithmetic."""

    calls = 0

    def score(self, task, completion):
        QuarterNaNEnv.calls += 1
        return float("nan") if QuarterNaNEnv.calls % 4 == 0 else super().score(task, completion)
