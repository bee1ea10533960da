"""Reading numbers out of free text as exact `Fraction`s, so equal values compare equal however they are written.

`1,234` == `1234`, `$5` == `5`, `3.50` == `3.5` == `7/2`, `1/2` == `0.5` == `2/4`, `-4` == `−4`; trailing units,
percent signs and periods are not part of the number. LaTeX forms (`\\frac{1}{2}`, `1{,}234`, `\\$5`) are rewritten
to plain text first.
"""

from __future__ import annotations

import re
from fractions import Fraction

CURRENCY_SIGNS = "$€£¥₹"
MINUS_SIGNS = "-−"
_DIGITS = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
# A number not glued to a preceding word or digit: optional sign and currency (either order), digits with optional
# thousands separators and decimals, and an optional `/denominator`.
NUMBER = (
    rf"(?<![\w.])(?P<sign>[{MINUS_SIGNS}])?\s?(?P<currency>[{CURRENCY_SIGNS}])?\s?(?P<sign2>[{MINUS_SIGNS}])?"
    rf"(?P<value>{_DIGITS})(?:\s?/\s?(?P<denominator>\d+(?:\.\d+)?))?(?!\d)"
)
NUMBER_RE = re.compile(NUMBER)
_LATEX_REWRITES = (
    (re.compile(r"\\[dt]?frac\s*\{\s*([^{}]*?)\s*\}\s*\{\s*([^{}]*?)\s*\}"), r"\1/\2"),
    (re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}"), r"\1"),
    (re.compile(r"\{,\}"), ","),
    (re.compile(r"\\([$%])"), r"\1"),
    (re.compile(r"\\[,!;]"), ""),
)


def clean_latex(text: str) -> str:
    """Rewrite the LaTeX spellings of numbers (fractions, escaped signs, `{,}` separators) as plain text."""
    for pattern, replacement in _LATEX_REWRITES:
        text = pattern.sub(replacement, text)
    return text


def number_value(match: re.Match[str]) -> Fraction | None:
    """The exact value of a `NUMBER` match, or None when it cannot be one (zero denominator, absurd length)."""
    try:
        value = Fraction(match.group("value").replace(",", ""))
        denominator = match.group("denominator")
        if denominator is not None:
            value /= Fraction(denominator)
    except (ValueError, ZeroDivisionError):
        return None
    return -value if match.group("sign") or match.group("sign2") else value


def parse_number(text: str) -> Fraction | None:
    """The number that `text` starts with (after whitespace), e.g. "$1,234.50 dollars." -> 2469/2; None if none."""
    match = NUMBER_RE.match(clean_latex(text).strip())
    return number_value(match) if match else None


def last_number(text: str) -> Fraction | None:
    """The value of the last number anywhere in `text`, or None."""
    matches = list(NUMBER_RE.finditer(clean_latex(text)))
    return number_value(matches[-1]) if matches else None


def format_number(value: Fraction) -> str:
    """A canonical spelling: "72", "-3.5" for terminating decimals, "1/3" otherwise."""
    if value.denominator == 1:
        return str(value.numerator)
    twos, fives = _multiplicity(value.denominator, 2), _multiplicity(value.denominator, 5)
    if 2**twos * 5**fives != value.denominator:
        return f"{value.numerator}/{value.denominator}"
    places = max(twos, fives)
    scaled = abs(value.numerator) * 10**places // value.denominator
    sign = "-" if value < 0 else ""
    whole, fraction = divmod(scaled, 10**places)
    return f"{sign}{whole}.{fraction:0{places}d}"


def _multiplicity(number: int, factor: int) -> int:
    count = 0
    while number % factor == 0:
        number //= factor
        count += 1
    return count
