"""Build the code_exec example's data: 30 small MBPP-style Python problems, each with hidden tests.

    python examples/code_exec/make_data.py              # writes examples/code_exec/data/{train,eval}.jsonl
    python examples/code_exec/make_data.py --out DIR

Each row has the `prompt` the model sees and a `tests` column it never sees: plain `assert` lines (MBPP style),
which `CodeExecutionEnv.reward` runs after the model's final ```python block. The problems and their reference
solutions are written for this example; the solutions are not written out (tests/unit check that each one passes
its tests). The first 24 problems train, the last 6 are held out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import NamedTuple

OUT = Path(__file__).resolve().parent / "data"
NUM_EVAL = 6
INSTRUCTIONS = (
    "You may try code with the run_python tool. Finish with your solution as one ```python block that defines `{}`."
)


class Problem(NamedTuple):
    name: str  # the function to write
    task: str
    solution: str  # reference solution: never written out
    tests: list[str]  # hidden `assert` lines


PROBLEMS = [
    Problem(
        "add",
        "Write a function add(a, b) that returns the sum of two numbers.",
        "def add(a, b):\n    return a + b",
        ["assert add(2, 3) == 5", "assert add(-4, 4) == 0", "assert add(1.5, 2) == 3.5"],
    ),
    Problem(
        "is_even",
        "Write a function is_even(n) that returns True when the integer n is even and False otherwise.",
        "def is_even(n):\n    return n % 2 == 0",
        [
            "assert is_even(4) is True",
            "assert is_even(7) is False",
            "assert is_even(0) is True",
            "assert is_even(-3) is False",
        ],
    ),
    Problem(
        "max_of_three",
        "Write a function max_of_three(a, b, c) that returns the largest of three numbers.",
        "def max_of_three(a, b, c):\n    return max(a, b, c)",
        [
            "assert max_of_three(1, 2, 3) == 3",
            "assert max_of_three(9, -1, 4) == 9",
            "assert max_of_three(5, 5, 2) == 5",
        ],
    ),
    Problem(
        "reverse_string",
        "Write a function reverse_string(s) that returns the string s reversed.",
        "def reverse_string(s):\n    return s[::-1]",
        [
            "assert reverse_string('abc') == 'cba'",
            "assert reverse_string('') == ''",
            "assert reverse_string('a b') == 'b a'",
        ],
    ),
    Problem(
        "count_vowels",
        "Write a function count_vowels(s) that returns how many vowels (a, e, i, o, u, either case) s contains.",
        "def count_vowels(s):\n    return sum(ch in 'aeiouAEIOU' for ch in s)",
        ["assert count_vowels('hello') == 2", "assert count_vowels('SKY') == 0", "assert count_vowels('AeIoU') == 5"],
    ),
    Problem(
        "factorial",
        "Write a function factorial(n) that returns n! for a non-negative integer n (0! is 1).",
        "def factorial(n):\n    out = 1\n    for k in range(2, n + 1):\n        out *= k\n    return out",
        [
            "assert factorial(0) == 1",
            "assert factorial(1) == 1",
            "assert factorial(5) == 120",
            "assert factorial(10) == 3628800",
        ],
    ),
    Problem(
        "fibonacci",
        "Write a function fibonacci(n) that returns the n-th Fibonacci number, where fibonacci(0) is 0 and "
        "fibonacci(1) is 1.",
        "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
        [
            "assert fibonacci(0) == 0",
            "assert fibonacci(1) == 1",
            "assert fibonacci(7) == 13",
            "assert fibonacci(20) == 6765",
        ],
    ),
    Problem(
        "is_palindrome",
        "Write a function is_palindrome(s) that returns True when the string s reads the same backwards.",
        "def is_palindrome(s):\n    return s == s[::-1]",
        [
            "assert is_palindrome('level') is True",
            "assert is_palindrome('levels') is False",
            "assert is_palindrome('') is True",
        ],
    ),
    Problem(
        "sum_list",
        "Write a function sum_list(xs) that returns the sum of a list of numbers (0 for an empty list).",
        "def sum_list(xs):\n    return sum(xs)",
        ["assert sum_list([1, 2, 3]) == 6", "assert sum_list([]) == 0", "assert sum_list([-5, 5, 10]) == 10"],
    ),
    Problem(
        "square_all",
        "Write a function square_all(xs) that returns a new list with the square of each number in xs.",
        "def square_all(xs):\n    return [x * x for x in xs]",
        ["assert square_all([1, 2, 3]) == [1, 4, 9]", "assert square_all([]) == []", "assert square_all([-2]) == [4]"],
    ),
    Problem(
        "keep_positive",
        "Write a function keep_positive(xs) that returns the numbers of xs that are greater than zero, in order.",
        "def keep_positive(xs):\n    return [x for x in xs if x > 0]",
        [
            "assert keep_positive([3, -1, 0, 2]) == [3, 2]",
            "assert keep_positive([-1]) == []",
            "assert keep_positive([]) == []",
        ],
    ),
    Problem(
        "count_words",
        "Write a function count_words(s) that returns the number of words in s, where words are separated by "
        "whitespace.",
        "def count_words(s):\n    return len(s.split())",
        [
            "assert count_words('one two three') == 3",
            "assert count_words('') == 0",
            "assert count_words('  a  b ') == 2",
        ],
    ),
    Problem(
        "celsius_to_fahrenheit",
        "Write a function celsius_to_fahrenheit(c) that converts a temperature from Celsius to Fahrenheit.",
        "def celsius_to_fahrenheit(c):\n    return c * 9 / 5 + 32",
        [
            "assert celsius_to_fahrenheit(0) == 32",
            "assert celsius_to_fahrenheit(100) == 212",
            "assert celsius_to_fahrenheit(-40) == -40",
        ],
    ),
    Problem(
        "is_prime",
        "Write a function is_prime(n) that returns True when the integer n is a prime number.",
        "def is_prime(n):\n    if n < 2:\n        return False\n"
        "    return all(n % d for d in range(2, int(n ** 0.5) + 1))",
        [
            "assert is_prime(2) is True",
            "assert is_prime(15) is False",
            "assert is_prime(97) is True",
            "assert is_prime(1) is False",
            "assert is_prime(0) is False",
        ],
    ),
    Problem(
        "gcd",
        "Write a function gcd(a, b) that returns the greatest common divisor of two positive integers.",
        "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a",
        ["assert gcd(12, 18) == 6", "assert gcd(7, 13) == 1", "assert gcd(100, 25) == 25"],
    ),
    Problem(
        "second_largest",
        "Write a function second_largest(xs) that returns the second largest distinct value in the list xs (xs "
        "holds at least two distinct values).",
        "def second_largest(xs):\n    return sorted(set(xs))[-2]",
        [
            "assert second_largest([1, 3, 2]) == 2",
            "assert second_largest([5, 5, 4]) == 4",
            "assert second_largest([-1, -7, -3]) == -3",
        ],
    ),
    Problem(
        "remove_duplicates",
        "Write a function remove_duplicates(xs) that returns xs without repeated items, keeping the first "
        "occurrence of each in its original order.",
        "def remove_duplicates(xs):\n    return list(dict.fromkeys(xs))",
        [
            "assert remove_duplicates([1, 2, 1, 3, 2]) == [1, 2, 3]",
            "assert remove_duplicates([]) == []",
            "assert remove_duplicates(['b', 'a', 'b']) == ['b', 'a']",
        ],
    ),
    Problem(
        "char_frequency",
        "Write a function char_frequency(s) that returns a dict mapping each character of s to how many times "
        "it occurs.",
        "def char_frequency(s):\n    out = {}\n    for ch in s:\n        out[ch] = out.get(ch, 0) + 1\n    return out",
        ["assert char_frequency('abca') == {'a': 2, 'b': 1, 'c': 1}", "assert char_frequency('') == {}"],
    ),
    Problem(
        "capitalize_words",
        "Write a function capitalize_words(s) that returns s with the first letter of every space-separated "
        "word in upper case and the rest unchanged.",
        "def capitalize_words(s):\n    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))",
        [
            "assert capitalize_words('hello world') == 'Hello World'",
            "assert capitalize_words('a bC') == 'A BC'",
            "assert capitalize_words('') == ''",
        ],
    ),
    Problem(
        "flatten",
        "Write a function flatten(xss) that turns a list of lists into one list with all their items, in order.",
        "def flatten(xss):\n    return [x for xs in xss for x in xs]",
        [
            "assert flatten([[1, 2], [3], []]) == [1, 2, 3]",
            "assert flatten([]) == []",
            "assert flatten([['a'], ['b', 'c']]) == ['a', 'b', 'c']",
        ],
    ),
    Problem(
        "digit_sum",
        "Write a function digit_sum(n) that returns the sum of the decimal digits of a non-negative integer n.",
        "def digit_sum(n):\n    return sum(int(d) for d in str(n))",
        ["assert digit_sum(0) == 0", "assert digit_sum(1234) == 10", "assert digit_sum(99) == 18"],
    ),
    Problem(
        "merge_sorted",
        "Write a function merge_sorted(a, b) that merges two sorted lists into one sorted list.",
        "def merge_sorted(a, b):\n    return sorted(a + b)",
        [
            "assert merge_sorted([1, 4], [2, 3]) == [1, 2, 3, 4]",
            "assert merge_sorted([], [5]) == [5]",
            "assert merge_sorted([1, 1], [1]) == [1, 1, 1]",
        ],
    ),
    Problem(
        "find_index",
        "Write a function find_index(xs, x) that returns the index of the first occurrence of x in the list "
        "xs, or -1 when x is not in it.",
        "def find_index(xs, x):\n    return xs.index(x) if x in xs else -1",
        [
            "assert find_index([4, 5, 6], 5) == 1",
            "assert find_index([4, 5, 6], 9) == -1",
            "assert find_index([2, 2], 2) == 0",
        ],
    ),
    Problem(
        "product",
        "Write a function product(xs) that returns the product of a list of numbers (1 for an empty list).",
        "def product(xs):\n    out = 1\n    for x in xs:\n        out *= x\n    return out",
        ["assert product([2, 3, 4]) == 24", "assert product([]) == 1", "assert product([5, 0]) == 0"],
    ),
    Problem(
        "is_anagram",
        "Write a function is_anagram(a, b) that returns True when the strings a and b contain the same letters "
        "the same number of times.",
        "def is_anagram(a, b):\n    return sorted(a) == sorted(b)",
        [
            "assert is_anagram('listen', 'silent') is True",
            "assert is_anagram('abc', 'abd') is False",
            "assert is_anagram('aab', 'ab') is False",
        ],
    ),
    Problem(
        "running_sum",
        "Write a function running_sum(xs) that returns the list of running totals of xs: item i is the sum of "
        "xs[0] to xs[i].",
        "def running_sum(xs):\n    out, total = [], 0\n    for x in xs:\n        total += x\n"
        "        out.append(total)\n    return out",
        [
            "assert running_sum([1, 2, 3]) == [1, 3, 6]",
            "assert running_sum([]) == []",
            "assert running_sum([5, -5]) == [5, 0]",
        ],
    ),
    Problem(
        "min_max",
        "Write a function min_max(xs) that returns a tuple (smallest, largest) of a non-empty list of numbers.",
        "def min_max(xs):\n    return min(xs), max(xs)",
        [
            "assert min_max([3, 1, 2]) == (1, 3)",
            "assert min_max([7]) == (7, 7)",
            "assert min_max([-2, 8, 0]) == (-2, 8)",
        ],
    ),
    Problem(
        "rotate_left",
        "Write a function rotate_left(xs, k) that returns the list xs rotated left by k positions (k may be "
        "larger than the length; an empty list stays empty).",
        "def rotate_left(xs, k):\n    if not xs:\n        return []\n    k %= len(xs)\n    return xs[k:] + xs[:k]",
        [
            "assert rotate_left([1, 2, 3, 4], 1) == [2, 3, 4, 1]",
            "assert rotate_left([1, 2, 3], 5) == [3, 1, 2]",
            "assert rotate_left([], 3) == []",
        ],
    ),
    Problem(
        "to_binary",
        "Write a function to_binary(n) that returns the binary representation of a non-negative integer n as a "
        "string without a prefix, e.g. to_binary(5) is '101'.",
        "def to_binary(n):\n    return format(n, 'b')",
        ["assert to_binary(5) == '101'", "assert to_binary(0) == '0'", "assert to_binary(16) == '10000'"],
    ),
    Problem(
        "chunk",
        "Write a function chunk(xs, n) that splits the list xs into consecutive pieces of length n (the last "
        "piece may be shorter).",
        "def chunk(xs, n):\n    return [xs[i : i + n] for i in range(0, len(xs), n)]",
        [
            "assert chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]",
            "assert chunk([], 3) == []",
            "assert chunk([1, 2], 5) == [[1, 2]]",
        ],
    ),
]


def make_rows() -> list[dict]:
    """One row per problem: `id`, `prompt` (chat messages), hidden `tests` and `entry_point`."""
    return [
        {
            "id": f"code-{name}",
            "prompt": [{"role": "user", "content": f"{task}\n\n{INSTRUCTIONS.format(name)}"}],
            "tests": "\n".join(tests),
            "entry_point": name,
        }
        for name, task, _, tests in PROBLEMS
    ]


def write(out_dir: Path = OUT) -> dict[str, Path]:
    """Write train.jsonl and eval.jsonl under `out_dir`; returns their paths by split."""
    rows = make_rows()
    splits = {"train": rows[:-NUM_EVAL], "eval": rows[-NUM_EVAL:]}
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, split_rows in splits.items():
        paths[split] = out_dir / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(row) + "\n" for row in split_rows))
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="output folder (default: %(default)s)")
    for split, path in write(parser.parse_args().out).items():
        print(f"{split}: {path}")
