"""The planner's estimates as a plain-text table (GiB per GPU), for `rl/launch/plan` and preflight's messages."""

from __future__ import annotations

from collections.abc import Sequence

from rl.backends.planner.estimate import TERMS, Estimate
from rl.backends.planner.terms import GIB


def gib(value: float) -> str:
    return f"{value / GIB:.2f}" if value < 10 * GIB else f"{value / GIB:.1f}"


def verdict(estimate: Estimate, gpu_bytes: float | None) -> str:
    if estimate.excluded:
        return "excluded"
    fits = estimate.fits(gpu_bytes)
    return "?" if fits is None else "fits" if fits else "no"


def breakdown(estimate: Estimate) -> str:
    """`params 1.2, grads 0.3, ...` GiB: the non-zero terms."""
    return ", ".join(f"{name} {gib(estimate.terms[name])}" for name in TERMS if estimate.terms.get(name))


def render(estimates: Sequence[Estimate], gpu_bytes: float | None, mark: Estimate | None = None) -> str:
    """One row per estimate: the layout, each term, the peak and its phase, whether it fits, and why a row is
    excluded or what to watch (notes). `mark` (the configured layout) gets a `*`."""
    headers = ["layout", *TERMS, "peak", "phase", "fits", "note"]
    rows = []
    for e in estimates:
        label = ("* " if mark is not None and e.knobs == mark.knobs else "  ") + e.label
        if e.excluded:
            rows.append([label, *("-" for _ in TERMS), "-", "-", "excluded", e.excluded])
            continue
        rows.append([label, *(gib(e.terms.get(name, 0.0)) for name in TERMS), gib(e.peak), e.phase,
                     verdict(e, gpu_bytes), "; ".join(e.notes)])
    widths = [max(len(headers[i]), *(len(row[i]) for row in rows)) if rows else len(headers[i])
              for i in range(len(headers))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        cells = [cell.ljust(w) if i in (0, len(row) - 1, len(row) - 3, len(row) - 2) else cell.rjust(w)
                 for i, (cell, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
