"""Number reading and canonical spelling, checked against values worked out by hand."""

from fractions import Fraction

import pytest

from rl.tasks.gsm8k.numbers import format_number, last_number, parse_number


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("72", Fraction(72)),
        ("  72  ", Fraction(72)),
        ("1,234", Fraction(1234)),
        ("1,234,567.5", Fraction(2469135, 2)),
        ("$1,234.50 dollars.", Fraction(2469, 2)),
        ("£3", Fraction(3)),
        ("12 dollars", Fraction(12)),
        ("40%", Fraction(40)),
        ("18.", Fraction(18)),
        ("3.50", Fraction(7, 2)),
        ("7/2", Fraction(7, 2)),
        ("2 / 4", Fraction(1, 2)),
        (".5", Fraction(1, 2)),
        ("-4", Fraction(-4)),
        ("−4", Fraction(-4)),
        ("-$4", Fraction(-4)),
        ("$-4", Fraction(-4)),
        ("\\frac{3}{4}", Fraction(3, 4)),
        ("1{,}000", Fraction(1000)),
        ("\\$5", Fraction(5)),
        ("0", Fraction(0)),
    ],
)
def test_parse_number(text, expected):
    assert parse_number(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "five", "$", "-", "1/0", "x12"])
def test_parse_number_rejects(text):
    assert parse_number(text) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16 - 3 - 4 = 9", Fraction(9)),
        ("she had 3 and then -2 more", Fraction(-2)),
        ("costs $2.50 each.", Fraction(5, 2)),
        ("from 1,000 to 2,500 people", Fraction(2500)),
        ("none", None),
    ],
)
def test_last_number(text, expected):
    assert last_number(text) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Fraction(72), "72"),
        (Fraction(-5), "-5"),
        (Fraction(7, 2), "3.5"),
        (Fraction(-1, 4), "-0.25"),
        (Fraction(1, 20), "0.05"),
        (Fraction(1, 3), "1/3"),
        (Fraction(-5, 6), "-5/6"),
    ],
)
def test_format_number(value, expected):
    assert format_number(value) == expected
