"""Write `scalerl/envs/data/code_tasks.jsonl`: small function-writing problems for the `code` env.

Each problem is (signature, what it should do, reference solution, assert tests). Every reference
solution is checked against its tests here, in this process, before the file is written, so the
shipped file never holds a task its own answer fails. Run: `python scripts/make_code_tasks.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "scalerl" / "envs" / "data" / "code_tasks.jsonl"

# (entry point, signature, description, reference solution body, tests)
PROBLEMS = [
    ("add", "add(a, b)", "returns the sum of a and b", "return a + b",
     ["assert add(1, 2) == 3", "assert add(-4, 4) == 0", "assert add(10, 5) == 15", "assert add(0, 0) == 0"]),
    ("sub", "sub(a, b)", "returns a minus b", "return a - b",
     ["assert sub(5, 3) == 2", "assert sub(0, 7) == -7", "assert sub(-2, -2) == 0", "assert sub(100, 1) == 99"]),
    ("mul", "mul(a, b)", "returns the product of a and b", "return a * b",
     ["assert mul(3, 4) == 12", "assert mul(-2, 5) == -10", "assert mul(0, 9) == 0", "assert mul(7, 7) == 49"]),
    ("square", "square(x)", "returns x squared", "return x * x",
     ["assert square(3) == 9", "assert square(-4) == 16", "assert square(0) == 0", "assert square(11) == 121"]),
    ("is_even", "is_even(n)", "returns True if the integer n is even, else False", "return n % 2 == 0",
     ["assert is_even(4) is True", "assert is_even(7) is False", "assert is_even(0) is True", "assert is_even(-3) is False"]),
    ("absolute", "absolute(x)", "returns the absolute value of x without using abs", "return -x if x < 0 else x",
     ["assert absolute(-5) == 5", "assert absolute(3) == 3", "assert absolute(0) == 0", "assert absolute(-0.5) == 0.5"]),
    ("maximum", "maximum(xs)", "returns the largest element of the non-empty list xs", "return max(xs)",
     ["assert maximum([1, 5, 3]) == 5", "assert maximum([-1, -7]) == -1", "assert maximum([4]) == 4", "assert maximum([2, 2, 9, 0]) == 9"]),
    ("minimum", "minimum(xs)", "returns the smallest element of the non-empty list xs", "return min(xs)",
     ["assert minimum([1, 5, 3]) == 1", "assert minimum([-1, -7]) == -7", "assert minimum([4]) == 4", "assert minimum([2, 2, 9, 0]) == 0"]),
    ("total", "total(xs)", "returns the sum of the numbers in the list xs", "return sum(xs)",
     ["assert total([1, 2, 3]) == 6", "assert total([]) == 0", "assert total([-1, 1]) == 0", "assert total([10]) == 10"]),
    ("mean", "mean(xs)", "returns the arithmetic mean of the non-empty list xs", "return sum(xs) / len(xs)",
     ["assert mean([1, 2, 3]) == 2", "assert mean([4]) == 4", "assert mean([1, 2]) == 1.5", "assert mean([-2, 2]) == 0"]),
    ("reverse", "reverse(s)", "returns the string s reversed", "return s[::-1]",
     ["assert reverse('abc') == 'cba'", "assert reverse('') == ''", "assert reverse('a') == 'a'", "assert reverse('ab cd') == 'dc ba'"]),
    ("is_palindrome", "is_palindrome(s)", "returns True if the string s reads the same backwards", "return s == s[::-1]",
     ["assert is_palindrome('racecar') is True", "assert is_palindrome('ab') is False", "assert is_palindrome('') is True",
      "assert is_palindrome('abba') is True"]),
    ("count_vowels", "count_vowels(s)", "returns how many of the characters of s are in 'aeiou'",
     "return sum(c in 'aeiou' for c in s)",
     ["assert count_vowels('hello') == 2", "assert count_vowels('xyz') == 0", "assert count_vowels('aeiou') == 5",
      "assert count_vowels('') == 0"]),
    ("factorial", "factorial(n)", "returns n! for an integer n >= 0",
     "r = 1\n    for i in range(2, n + 1):\n        r *= i\n    return r",
     ["assert factorial(0) == 1", "assert factorial(1) == 1", "assert factorial(5) == 120", "assert factorial(10) == 3628800"]),
    ("fib", "fib(n)", "returns the n-th Fibonacci number, with fib(0) == 0 and fib(1) == 1",
     "a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
     ["assert fib(0) == 0", "assert fib(1) == 1", "assert fib(7) == 13", "assert fib(20) == 6765"]),
    ("is_prime", "is_prime(n)", "returns True if the integer n is a prime number",
     "return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))",
     ["assert is_prime(2) is True", "assert is_prime(1) is False", "assert is_prime(17) is True", "assert is_prime(21) is False"]),
    ("gcd", "gcd(a, b)", "returns the greatest common divisor of the positive integers a and b",
     "while b:\n        a, b = b, a % b\n    return a",
     ["assert gcd(12, 18) == 6", "assert gcd(7, 3) == 1", "assert gcd(10, 10) == 10", "assert gcd(100, 75) == 25"]),
    ("count_char", "count_char(s, c)", "returns how many times the character c occurs in the string s", "return s.count(c)",
     ["assert count_char('banana', 'a') == 3", "assert count_char('', 'x') == 0", "assert count_char('xyz', 'q') == 0",
      "assert count_char('aaa', 'a') == 3"]),
    ("first", "first(xs)", "returns the first element of the list xs, or None when it is empty",
     "return xs[0] if xs else None",
     ["assert first([3, 4]) == 3", "assert first([]) is None", "assert first(['a']) == 'a'", "assert first([None, 1]) is None"]),
    ("last", "last(xs)", "returns the last element of the list xs, or None when it is empty",
     "return xs[-1] if xs else None",
     ["assert last([3, 4]) == 4", "assert last([]) is None", "assert last(['a']) == 'a'", "assert last([1, 2, 3]) == 3"]),
    ("evens", "evens(xs)", "returns the even integers of the list xs, in order", "return [x for x in xs if x % 2 == 0]",
     ["assert evens([1, 2, 3, 4]) == [2, 4]", "assert evens([]) == []", "assert evens([1, 3]) == []", "assert evens([0, -2]) == [0, -2]"]),
    ("doubled", "doubled(xs)", "returns a new list with every element of xs multiplied by 2", "return [2 * x for x in xs]",
     ["assert doubled([1, 2]) == [2, 4]", "assert doubled([]) == []", "assert doubled([-3]) == [-6]", "assert doubled([0, 5]) == [0, 10]"]),
    ("unique", "unique(xs)", "returns the elements of xs without duplicates, keeping first occurrences in order",
     "return list(dict.fromkeys(xs))",
     ["assert unique([1, 2, 1, 3]) == [1, 2, 3]", "assert unique([]) == []", "assert unique([5, 5, 5]) == [5]",
      "assert unique(['b', 'a', 'b']) == ['b', 'a']"]),
    ("sort_list", "sort_list(xs)", "returns a new list with the elements of xs in ascending order", "return sorted(xs)",
     ["assert sort_list([3, 1, 2]) == [1, 2, 3]", "assert sort_list([]) == []", "assert sort_list([1]) == [1]",
      "assert sort_list([2, -1, 2]) == [-1, 2, 2]"]),
    ("length", "length(xs)", "returns the number of elements of the list xs without using len",
     "n = 0\n    for _ in xs:\n        n += 1\n    return n",
     ["assert length([1, 2, 3]) == 3", "assert length([]) == 0", "assert length(['a']) == 1", "assert length([[], []]) == 2"]),
    ("upper", "upper(s)", "returns the string s in upper case", "return s.upper()",
     ["assert upper('abc') == 'ABC'", "assert upper('') == ''", "assert upper('a1b') == 'A1B'", "assert upper('XY') == 'XY'"]),
    ("words", "words(s)", "returns the list of words of s, split on whitespace", "return s.split()",
     ["assert words('a b c') == ['a', 'b', 'c']", "assert words('') == []", "assert words('  hi  there ') == ['hi', 'there']",
      "assert words('one') == ['one']"]),
    ("capitalize_words", "capitalize_words(s)", "returns s with the first letter of every space-separated word upper-cased",
     "return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))",
     ["assert capitalize_words('hello world') == 'Hello World'", "assert capitalize_words('') == ''",
      "assert capitalize_words('a') == 'A'", "assert capitalize_words('x yz') == 'X Yz'"]),
    ("clamp", "clamp(x, lo, hi)", "returns x limited to the range [lo, hi]", "return max(lo, min(hi, x))",
     ["assert clamp(5, 0, 10) == 5", "assert clamp(-1, 0, 10) == 0", "assert clamp(11, 0, 10) == 10", "assert clamp(0, 0, 0) == 0"]),
    ("sign", "sign(x)", "returns 1 for positive x, -1 for negative x and 0 for zero", "return (x > 0) - (x < 0)",
     ["assert sign(5) == 1", "assert sign(-2) == -1", "assert sign(0) == 0", "assert sign(-0.1) == -1"]),
    ("digit_sum", "digit_sum(n)", "returns the sum of the decimal digits of the integer n >= 0", "return sum(map(int, str(n)))",
     ["assert digit_sum(123) == 6", "assert digit_sum(0) == 0", "assert digit_sum(9) == 9", "assert digit_sum(1001) == 2"]),
    ("count_positive", "count_positive(xs)", "returns how many numbers in xs are greater than zero",
     "return sum(1 for x in xs if x > 0)",
     ["assert count_positive([1, -1, 2]) == 2", "assert count_positive([]) == 0", "assert count_positive([0]) == 0",
      "assert count_positive([3, 3]) == 2"]),
    ("index_of", "index_of(xs, x)", "returns the index of the first occurrence of x in xs, or -1 if absent",
     "return xs.index(x) if x in xs else -1",
     ["assert index_of([1, 2, 3], 2) == 1", "assert index_of([], 1) == -1", "assert index_of([5, 5], 5) == 0",
      "assert index_of(['a'], 'b') == -1"]),
    ("repeat", "repeat(s, n)", "returns the string s repeated n times", "return s * n",
     ["assert repeat('ab', 3) == 'ababab'", "assert repeat('x', 0) == ''", "assert repeat('', 5) == ''", "assert repeat('q', 1) == 'q'"]),
    ("power", "power(b, e)", "returns b raised to the integer power e >= 0 without using ** or pow",
     "r = 1\n    for _ in range(e):\n        r *= b\n    return r",
     ["assert power(2, 10) == 1024", "assert power(5, 0) == 1", "assert power(-3, 3) == -27", "assert power(1, 50) == 1"]),
    ("flatten", "flatten(xss)", "returns the elements of a list of lists xss in one flat list",
     "return [x for xs in xss for x in xs]",
     ["assert flatten([[1, 2], [3]]) == [1, 2, 3]", "assert flatten([]) == []", "assert flatten([[], [4]]) == [4]",
      "assert flatten([['a'], ['b', 'c']]) == ['a', 'b', 'c']"]),
    ("second_largest", "second_largest(xs)", "returns the second largest distinct value of xs (it has at least two)",
     "return sorted(set(xs))[-2]",
     ["assert second_largest([1, 2, 3]) == 2", "assert second_largest([5, 5, 4]) == 4", "assert second_largest([-1, -2]) == -2",
      "assert second_largest([10, 1, 10, 7]) == 7"]),
    ("char_freq", "char_freq(s)", "returns a dict mapping each character of s to how many times it occurs",
     "d = {}\n    for c in s:\n        d[c] = d.get(c, 0) + 1\n    return d",
     ["assert char_freq('aab') == {'a': 2, 'b': 1}", "assert char_freq('') == {}", "assert char_freq('z') == {'z': 1}",
      "assert char_freq('abab') == {'a': 2, 'b': 2}"]),
    ("remove_spaces", "remove_spaces(s)", "returns s with every space character removed", "return s.replace(' ', '')",
     ["assert remove_spaces('a b c') == 'abc'", "assert remove_spaces('') == ''", "assert remove_spaces('   ') == ''",
      "assert remove_spaces('ab') == 'ab'"]),
    ("is_sorted", "is_sorted(xs)", "returns True if the list xs is in non-decreasing order",
     "return all(a <= b for a, b in zip(xs, xs[1:]))",
     ["assert is_sorted([1, 2, 2, 3]) is True", "assert is_sorted([2, 1]) is False", "assert is_sorted([]) is True",
      "assert is_sorted([5]) is True"]),
]


def build_rows() -> list[dict]:
    rows = []
    for entry_point, signature, description, body, tests in PROBLEMS:
        solution = f"def {signature}:\n    {body}\n"
        namespace: dict = {}
        exec(solution, namespace)  # our own reference answers, checked before shipping
        for test in tests:
            exec(test, namespace)
        prompt = f"Write a Python function {signature} that {description}. Reply with the code only."
        rows.append({"prompt": prompt, "tests": tests, "entry_point": entry_point, "solution": solution})
    return rows


def main() -> None:
    rows = build_rows()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} tasks to {OUT}")


if __name__ == "__main__":
    main()
