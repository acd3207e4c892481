"""Writes `scalerl/rewards/data/arithmetic_preferences.jsonl`, the preference set shipped for `scalerl train-rm`.

One pair per prompt for the first 1500 prompts of the arithmetic environment's *training* pool
(never its held-out set, so a reward model trained here can be judged on the held-out prompts):

    {"prompt": "12+35=", "chosen": "47", "rejected": "52"}

`chosen` is the exact sum; `rejected` is a wrong sum, half the time off by 1-10 (the near misses a
policy makes) and half the time a uniform number in [0, 198] (the range of sums). Texts are what
the policy would generate, without the end-of-sequence token: the reward model appends it.
Deterministic (`random.Random(0)`); the file is about 82 KB.

    python scripts/make_preference_data.py            # rewrites the shipped file
    python scripts/make_preference_data.py --n 200 --out /tmp/prefs.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from scalerl.envs.arithmetic import ArithmeticEnv

OUT = Path(__file__).resolve().parents[1] / "scalerl" / "rewards" / "data" / "arithmetic_preferences.jsonl"
MAX_SUM = 198  # 99 + 99


def wrong_answer(answer: int, rng: random.Random) -> int:
    """A wrong sum in [0, 198]: a near miss (off by 1-10) or any other number, with equal odds."""
    while True:
        if rng.random() < 0.5:
            candidate = answer + rng.choice([-1, 1]) * rng.randint(1, 10)
        else:
            candidate = rng.randint(0, MAX_SUM)
        if candidate != answer and 0 <= candidate <= MAX_SUM:
            return candidate


def make_pairs(n: int, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    tasks = ArithmeticEnv().train_tasks()[:n]
    return [{"prompt": t.prompt, "chosen": t.answer, "rejected": str(wrong_answer(int(t.answer), rng))} for t in tasks]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1500, help="pairs (one per training prompt, in the pool's order)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    pairs = make_pairs(args.n, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    print(f"wrote {len(pairs)} pairs to {args.out} ({args.out.stat().st_size / 1024:.1f} KB)")


if __name__ == "__main__":
    main()
