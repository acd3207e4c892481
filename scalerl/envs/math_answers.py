"""Is a completion's final answer mathematically equal to the gold one? (math-verify, made thread-safe.)

The gold answer is parsed as LaTeX math (`$answer$`), so `\\frac{3}{4}`, `3/4`, `0.75`, `x=3`,
`\\{1,2\\}` and `[0,1)` are all valid golds. The completion is parsed by math-verify's own
extraction (a `\\boxed{}` or `$...$` answer first, else the last plain expression: LaTeX outside
`$`/`\\boxed{}` is not read as LaTeX, so a bare `2^{10}` reads as 2), and, when that finds
nothing, as LaTeX math as a whole (so a bare `\\{2,1\\}` or `(0,1]` is read as a set or
interval). The two are equal when math-verify's `verify(gold, prediction)` says so: numerically to
6 decimals, or symbolically.

Timeouts: math-verify bounds each parse and comparison with `signal.alarm`, which works only in
the main thread of a process (worker *processes* qualify). Called from any other thread, the checks
run without that timeout instead of failing; a completion whose parsed answer holds a constant
exponent or factorial argument above `MAX_EXPONENT` in magnitude (power towers included: what
makes sympy hang) is judged wrong before comparison, on every thread.

Parses are memoised per process (bounded LRU), since a small policy repeats completions often.
math-verify and sympy (about a second to import) are imported on first use, so registering the
`math` environment costs nothing to runs that use another one.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import Any

MAX_EXPONENT = 1000


def signal_timeout(seconds: int) -> int | None:
    """`seconds` where math-verify's signal-based timeout can run (the main thread), else None."""
    return seconds if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=4096)
def parse_gold(answer: str, timeout_s: int | None) -> tuple:
    """The gold answer parsed as LaTeX math: a sympy object and its string, or () if unparsable."""
    from math_verify import parse
    return tuple(parse(f"${answer}$", parsing_timeout=timeout_s))


@lru_cache(maxsize=16384)
def parse_prediction(text: str, timeout_s: int | None) -> tuple:
    """The completion's answer as math-verify extracts it, falling back to the text as LaTeX math."""
    from math_verify import parse
    found = parse(text, parsing_timeout=timeout_s)
    if not found and text.strip():
        found = parse(f"${text.strip()}$", parsing_timeout=timeout_s)
    return tuple(found)


def too_costly(expr: object) -> bool:
    """True for sympy trees that can stall a comparison: a power x^e or factorial e! with a constant
    |e| > MAX_EXPONENT (which covers power towers). Checked bottom-up, so every constant that gets
    evaluated has only small exponents inside it."""
    from sympy import Basic, Pow, factorial
    if not isinstance(expr, Basic):
        return False
    if any(too_costly(arg) for arg in expr.args):
        return True
    if isinstance(expr, (Pow, factorial)):
        e = expr.exp if isinstance(expr, Pow) else expr.args[0]
        return bool(e.is_number) and not magnitude_at_most(e, MAX_EXPONENT)
    return False


def magnitude_at_most(value: Any, bound: float) -> bool:
    """|value| <= bound for a constant sympy expression; False when it has no finite value."""
    try:
        return abs(complex(value.evalf(5))) <= bound
    except (TypeError, ValueError):  # zoo, nan and the like: no finite magnitude to bound
        return False


def is_numeric_answer(parsed: tuple) -> bool:
    """True iff math-verify read a constant (a number, fraction, or set/interval of numbers: no free
    symbols) or an equation `symbol = constant` such as `x=4`; False for words, `abc`, `x+1`."""
    from sympy import Basic, Eq, Symbol
    if not parsed or not isinstance(parsed[0], Basic):
        return False
    answer = parsed[0]
    if isinstance(answer, Eq) and isinstance(answer.lhs, Symbol):
        answer = answer.rhs
    return not answer.free_symbols


def answers_match(gold: str, text: str, *, timeout_s: int = 5) -> bool:
    """True iff math-verify judges the answer in `text` equal to `gold` (see the module docstring)."""
    from math_verify import verify
    timeout = signal_timeout(timeout_s)
    gold_parsed, predicted = parse_gold(gold, timeout), parse_prediction(text, timeout)
    if not gold_parsed or not predicted or too_costly(predicted[0]):
        return False
    return bool(verify(list(gold_parsed), list(predicted), timeout_seconds=timeout))
