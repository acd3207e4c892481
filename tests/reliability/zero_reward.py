"""A reward that gives nothing to learn from: importable as `zero_reward:zero` (tests/reliability is on sys.path)."""


def zero(prompts, completions, **kwargs):
    return [0.0] * len(completions)
