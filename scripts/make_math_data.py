"""Builds `scalerl/envs/data/math_small.jsonl`, the default data of the `math` environment (deterministic).

Short word-and-symbol problems whose prompts fit the built-in character model: only characters of
`scalerl.models.char_tokenizer.CHARS` and at most 24 of them, so prompt + answer fit its 64
positions. Kinds: fraction sums and products, simplifying a fraction, a decimal as a fraction,
percentages, one-step linear equations, signed integer expressions, means and halves.

Gold answers are written in varied but equivalent forms (`3/4`, `\\frac{3}{4}`, `0.75`,
`\\boxed{3/4}`, `x=4`) chosen by a seeded generator, so the data exercises math-verify's
equivalence checks: a policy that answers `0.75` to a gold `\\frac{3}{4}` is correct.

    python scripts/make_math_data.py              # rewrites scalerl/envs/data/math_small.jsonl
    python scripts/make_math_data.py --out /tmp/m.jsonl --per-kind 10
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from scalerl.models.char_tokenizer import CHARS

OUT = Path(__file__).resolve().parents[1] / "scalerl" / "envs" / "data" / "math_small.jsonl"
MAX_PROMPT_CHARS = 24
DENOMS = [2, 3, 4, 5, 6, 8, 10]


def terminates(q: Fraction) -> bool:
    """True iff q has a finite decimal expansion (its reduced denominator is 2^a·5^b)."""
    d = q.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


def answer_forms(q: Fraction, decimal: bool = True) -> list[str]:
    """Equivalent spellings of q that math-verify accepts as the gold answer (a decimal one only
    when `decimal` and q's expansion terminates)."""
    if q.denominator == 1:
        n = str(q.numerator)
        return [n, n, f"\\boxed{{{n}}}"]
    p, d = q.numerator, q.denominator
    sign = "-" if p < 0 else ""
    forms = [f"{p}/{d}", f"{sign}\\frac{{{abs(p)}}}{{{d}}}", f"\\boxed{{{p}/{d}}}"]
    if decimal and terminates(q):
        forms.append(f"{float(q):g}")
    return forms


def frac(rng: random.Random) -> Fraction:
    d = rng.choice(DENOMS)
    return Fraction(rng.randint(1, d - 1), d)


def show(q: Fraction) -> str:
    return f"{q.numerator}/{q.denominator}"


def frac_sum(rng: random.Random) -> tuple[str, Fraction]:
    a, b = frac(rng), frac(rng)
    return f"{show(a)}+{show(b)}=", a + b


def frac_product(rng: random.Random) -> tuple[str, Fraction]:
    a, b = frac(rng), frac(rng)
    return f"{show(a)}*{show(b)}=", a * b


def simplify(rng: random.Random) -> tuple[str, Fraction]:
    q, k = frac(rng), rng.randint(2, 6)
    return f"simplify {q.numerator * k}/{q.denominator * k}", q


def decimal_as_fraction(rng: random.Random) -> tuple[str, Fraction]:
    q = Fraction(rng.randint(1, 99), 100)
    return f"{float(q):g} as a fraction", q


def percentage(rng: random.Random) -> tuple[str, Fraction]:
    pct, n = rng.choice([10, 20, 25, 50, 75]), rng.randint(1, 20) * 4
    return f"{pct} percent of {n}=", Fraction(pct * n, 100)


def linear_equation(rng: random.Random) -> tuple[str, Fraction]:
    a, x, b = rng.randint(2, 9), rng.randint(-9, 9), rng.randint(1, 20)
    return f"{a}x+{b}={a * x + b}, x=?", Fraction(x)


def signed_expression(rng: random.Random) -> tuple[str, Fraction]:
    a, b, c = rng.randint(0, 20), rng.randint(2, 9), rng.randint(2, 9)
    return f"{a}-{b}*{c}=", Fraction(a - b * c)


def mean(rng: random.Random) -> tuple[str, Fraction]:
    xs = [rng.randint(1, 20) for _ in range(rng.choice([2, 3, 4]))]
    return "mean of " + " ".join(map(str, xs)), Fraction(sum(xs), len(xs))


def half(rng: random.Random) -> tuple[str, Fraction]:
    n = rng.randint(1, 99)
    return f"half of {n}=", Fraction(n, 2)


KINDS: dict[str, Callable[[random.Random], tuple[str, Fraction]]] = {
    "frac_sum": frac_sum, "frac_product": frac_product, "simplify": simplify,
    "decimal_as_fraction": decimal_as_fraction, "percentage": percentage, "linear_equation": linear_equation,
    "signed_expression": signed_expression, "mean": mean, "half": half,
}


def make_rows(per_kind: int, seed: int) -> list[dict]:
    """`per_kind` distinct problems of every kind, interleaved kind by kind, answers in seeded forms."""
    rng = random.Random(seed)
    allowed = set(CHARS)
    by_kind: dict[str, list[dict]] = {}
    for kind, make in KINDS.items():
        rows, seen = [], set()
        while len(rows) < per_kind:
            prompt, value = make(rng)
            if prompt in seen:
                continue
            assert len(prompt) <= MAX_PROMPT_CHARS and set(prompt) <= allowed, prompt
            seen.add(prompt)
            answer = rng.choice(answer_forms(value, decimal=kind != "decimal_as_fraction"))
            if kind == "linear_equation" and rng.random() < 0.3:
                answer = f"x={value.numerator}"
            rows.append({"prompt": prompt, "answer": answer, "kind": kind})
        by_kind[kind] = rows
    return [rows[i] for i in range(per_kind) for rows in by_kind.values()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--per-kind", type=int, default=36, help="problems of each of the 9 kinds")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = make_rows(args.per_kind, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(json.dumps({"out": str(args.out), "rows": len(rows)}))


if __name__ == "__main__":
    main()
