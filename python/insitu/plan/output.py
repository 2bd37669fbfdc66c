# SPDX-License-Identifier: Apache-2.0
"""Tables and plots of the planner's results, and the figures of the benchmark scripts
(``bench/report.py`` draws and writes its PNGs with :func:`pyplot` and :func:`save`).
Plots need matplotlib and are skipped, with a note, without it."""

from __future__ import annotations

import sys
from typing import List, Optional, Sequence

__all__ = ["table", "pyplot", "save", "fmt_s", "fmt_bytes"]


def fmt_s(v: Optional[float]) -> str:
    """Seconds, to a sensible precision."""
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 1:
        return f"{v:.2f}"
    if v >= 0.001:
        return f"{v:.4f}"
    return f"{v:.2e}"


def fmt_bytes(n: float) -> str:
    """Bytes in the largest of GiB, MiB and KiB that is not above them."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:g} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{int(n)} B"


def table(header: Sequence[str], rows: List[Sequence[object]], markdown: bool = False) -> str:
    """A plain-text (aligned) or Markdown table."""
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    if markdown:
        out = "| " + " | ".join(cells[0]) + " |\n|" + "|".join("---:" for _ in header) + "|\n"
        return out + "".join("| " + " | ".join(r) + " |\n" for r in cells[1:])
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def pyplot(skipped: str = "no plot written (pip install matplotlib)"):
    """matplotlib's pyplot on the Agg backend, or None when it is missing, after the note
    ``matplotlib not installed: SKIPPED`` on stderr (`skipped` says what the caller leaves
    out)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        print(f"matplotlib not installed: {skipped}", file=sys.stderr)
        return None


def save(fig, plt, path: str) -> str:
    """Writes the figure as a PNG (laid out tight, 120 dpi) and closes it; returns the path."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
