# SPDX-License-Identifier: Apache-2.0
"""What every benchmark script shares: running `insitu bench ... --json`, and writing a
result as RESULTS/NAME.json, RESULTS/NAME.md and RESULTS/NAME.png side by side.

A script describes a benchmark with two functions, `markdown(r) -> str` and
`plot(r, plt) -> figure` (`plt` is matplotlib's pyplot), and calls `write`. `--from-json
FILE` (see `add_options`) re-renders the Markdown and PNG of a result already written,
without running anything; `--out DIR` writes elsewhere than bench/results.

$INSITU overrides the insitu command (default: .venv/bin/insitu). Figures are drawn and
written by the package's own writer (`insitu.plan.output`), which the planner uses too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Callable, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
# The insitu command: the virtual environment's, unless $INSITU names another build.
INSITU = os.environ.get("INSITU", os.path.join(ROOT, ".venv", "bin", "insitu"))
# The package of this tree, also when a script runs in an interpreter without it installed.
sys.path.insert(0, os.path.join(ROOT, "python"))

from insitu.plan.output import pyplot, save  # noqa: E402


def add_options(ap: argparse.ArgumentParser) -> None:
    """Adds --from-json FILE and --out DIR to a script's arguments."""
    ap.add_argument("--from-json", metavar="FILE", help="re-render the Markdown and PNG of this result instead of running")
    ap.add_argument("--out", metavar="DIR", default=RESULTS, help="where to write the results (default: bench/results)")


def run(args: List[str], ok: Tuple[int, ...] = (0,)) -> Tuple[dict, int]:
    """Runs `insitu ARGS --json`; returns the report, with `command` set to the command
    line as run (`insitu ...`), and the exit code. Exits if the code is not in `ok`."""
    cmd = [INSITU] + args + ["--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode not in ok or not p.stdout.strip():
        sys.stderr.write(p.stderr)
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {p.returncode}")
    r = json.loads(p.stdout)
    r["command"] = " ".join(["insitu"] + cmd[1:])
    return r, p.returncode


def load(path: str) -> dict:
    """A result written before."""
    with open(path) as f:
        return json.load(f)


def write(r: dict, name: str, markdown: Callable[[dict], str], plot: Optional[Callable] = None, out: str = RESULTS, keep_json: bool = False) -> str:
    """Writes OUT/NAME.json (unless `keep_json`: the JSON it was read from stays), the
    Markdown `markdown(r)` as OUT/NAME.md and the figure `plot(r, pyplot)` as OUT/NAME.png;
    prints and returns the Markdown."""
    os.makedirs(out, exist_ok=True)
    base = os.path.join(out, name)
    if not keep_json:
        with open(base + ".json", "w") as f:
            json.dump(r, f, indent=2)
    md = markdown(r)
    with open(base + ".md", "w") as f:
        f.write(md)
    plt = pyplot(skipped="skipped the PNG") if plot else None
    if plt:
        save(plot(r, plt), plt, base + ".png")
    print(md)
    return md


def passthrough_main(bench: str, doc: str, markdown: Callable[[dict], str], plot: Optional[Callable] = None) -> int:
    """The whole `main` of a script whose arguments (after `--`) go to `insitu bench
    BENCH` unchanged: runs it and writes RESULTS/BENCH.*, or re-renders with --from-json."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(ap)
    ap.add_argument("args", nargs=argparse.REMAINDER, help=f"arguments of insitu bench {bench} (after --)")
    a = ap.parse_args()
    if a.from_json:
        rerender(a.from_json, markdown, plot, a.out)
        return 0
    r, _ = run(["bench", bench, *[x for x in a.args if x != "--"]])
    write(r, bench, markdown, plot, a.out)
    return 0


def rerender(path: str, markdown: Callable[[dict], str], plot: Optional[Callable], out: str) -> str:
    """Writes the Markdown and PNG of the result in `path` to OUT/NAME.{md,png}, NAME being
    the file's own name."""
    name = os.path.splitext(os.path.basename(path))[0]
    r = load(path)
    keep = os.path.abspath(os.path.dirname(path)) == os.path.abspath(out)
    return write(r, name, markdown, plot, out, keep_json=keep)
