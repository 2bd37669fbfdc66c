#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Planner results: CSDPLAN-EC's sweeps, DockerSSD's storage-pool LLM figures, and the
planner's predictions checked against runs on this machine. Writes
bench/results/plan-*.{json,md,png}.

Usage:
  bench/plan.py ec         # CSDPLAN-EC Figs. 5-7 with the paper's inputs (instant)
                           #   -> plan-ec-blocks, plan-ec-block-size, plan-ec-device-compute
  bench/plan.py llm        # DockerSSD Figs. 12-13 (a few seconds)
                           #   -> plan-llm-models, plan-llm-seq-len, plan-llm-batch
  bench/plan.py validate   # calibrate here, measure, compare (about 5 minutes on 2 cores)
                           #   -> plan-calibration.json, plan-validation.{json,md,png}
  bench/plan.py all
  bench/plan.py --from-json bench/results/plan-ec-blocks.json   # re-render one result

`validate` runs `insitu plan calibrate` (kernels at 32-128 MiB on 1-2 drives, ISA-L
encodes of other codes than the one checked), then the measured series — `insitu bench
break-even --drive newport --repeat 5` (256 MiB, 1..8 drives) and 1..6 drives encoding (16, 8) RS
stripes of 4 MiB blocks — and sets the calibrated predictions beside them. The benchmark runs
with glibc's mmap threshold pinned (MALLOC_MMAP_THRESHOLD_=131072), as the calibration's do.

The planner runs as `insitu plan` when the command has it, else as `python -m insitu.plan`;
$INSITU overrides the insitu command (default: .venv/bin/insitu).
"""

import argparse
import json
import os
import subprocess
import sys

import report

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(report.ROOT, "python"))

from insitu.plan import calibrate, plots, validate  # noqa: E402
from insitu.plan.output import fmt_bytes, fmt_s  # noqa: E402

# The erasure-coding configuration measured by `validate`: (16, 8) RS, 4 MiB blocks, each
# drive encoding 10 stripes, 1..6 drives at the newport budget (0.4 host cores).
EC_CHECK = {"n": 16, "k": 8, "block": 4 << 20, "rounds": 10, "max_drives": 6, "repeat": 5}


def planner() -> list:
    """The command that runs the planner."""
    cmd = [report.INSITU, "plan"]
    try:
        if subprocess.run(cmd + ["--help"], capture_output=True).returncode == 0:
            return cmd
    except OSError:
        pass
    return [sys.executable, "-m", "insitu.plan"]


def plan(args: list) -> dict:
    """Runs `insitu plan ARGS --json`; the result with `command` as a user would type it."""
    cmd = planner() + args + ["--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {p.returncode}")
    r = json.loads(p.stdout)
    r["command"] = " ".join(["insitu", "plan"] + args + ["--json"])
    return r


# ---------------------------------------------------------------------------------------
# CSDPLAN-EC sweeps

EC_SWEEPS = [
    # (name, arguments, what the paper shows)
    ("plan-ec-blocks", ["ec", "--sweep", "blocks", "--block-size", "64M", "--no-plot"], "Fig. 6b: BEP 2 at 12 blocks, 5 at 48 (64 MiB blocks)"),
    ("plan-ec-block-size", ["ec", "--sweep", "block-size", "--blocks", "24", "--no-plot"], "Fig. 5b: BEP 2 at 16 MiB, 3 at 128 MiB (24 blocks)"),
    (
        "plan-ec-device-compute",
        ["ec", "--sweep", "device-compute", "--blocks", "48", "--block-size", "64M", "--no-plot"],
        "Fig. 7a: BEP 5 falls to 1 at 5x CSD compute ((32, 16), 64 MiB)",
    ),
]


def ec_md(r: dict) -> str:
    p, i = r["sweep"], r["inputs"]
    s = f"# CSDPLAN-EC: break-even drives over {p}\n\n`{r['command']}`\n\n"
    s += f"Inputs: {i['source']}\n\n"
    if r.get("paper"):
        s += f"The paper: {r['paper']}.\n\n"
    s += f"| {p} | (n, k) | host encode s | CSD encode s | break-even drives |\n|---:|---:|---:|---:|---:|\n"
    for x in r["points"]:
        v = fmt_bytes(x[p]) if p == "block-size" else f"{x[p]:g}"
        s += f"| {v} | ({x['n']}, {x['k']}) | {fmt_s(x['host_encode_s'])} | {fmt_s(x['csd_encode_s'])} | {x['break_even'] or '-'} |\n"
    s += (
        "\nModel: T_SSD(M) = M x T_host_ec, T_CSD(M) = T_csd_ec (block transfer overlapped and paid once, "
        "left out as in the paper); the break-even point is the least M with T_CSD(M) < T_SSD(M).\n"
    )
    return s


def run_ec(out: str) -> None:
    for name, args, paper in EC_SWEEPS:
        r = plan(args)
        r["benchmark"] = "plan-ec-sweep"
        r["paper"] = paper
        report.write(r, name, ec_md, plots.ec_sweep, out)


# ---------------------------------------------------------------------------------------
# DockerSSD storage-pool LLM

LLM_RUNS = [
    ("plan-llm-models", ["llm", "--model", "all", "--seq-len", "32768", "--devices", "64"]),
    ("plan-llm-seq-len", ["llm", "--model", "lamda-137b,megatron-1t", "--sweep", "seq-len", "--systems", "h-cache,d-cache", "--no-plot"]),
    ("plan-llm-batch", ["llm", "--model", "lamda-137b,megatron-1t", "--sweep", "batch", "--seq-len", "256", "--systems", "h-cache,d-cache", "--no-plot"]),
]


def _assumed_md(r: dict) -> str:
    s = "\nInputs the paper does not give (assumed):\n\n"
    for k, v in r["assumed"].items():
        s += f"- {k}: {v['value']} — {v['why']}\n"
    return s


def llm_models_md(r: dict) -> str:
    s = f"# Storage-pool LLM inference: hosts vs computing drives (DockerSSD Fig. 12)\n\n`{r['command']}`\n\n"
    p0 = r["models"][0]
    s += f"{p0['devices']} nodes, sequence length {p0['seq_len']}, {p0['batch_per_device']} sequence per node; seconds per decode step (every sequence gets one token), the fastest data x tensor x pipeline split.\n\n"
    s += "| model | H-NoCache s (dp/tp/pp) | H-Cache s | D-NoCache s | D-Cache s | H-Cache gain over H-NoCache | D-Cache gain over D-NoCache | D-Cache gain over H-Cache | D-NoCache slowdown vs H-NoCache |\n"
    s += "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    for p in r["models"]:

        def c(name):
            v = p["systems"][name]
            return "does not fit" if v is None else f"{fmt_s(v['step_s'])} ({v['dp']}/{v['tp']}/{v['pp']}, {v['dominant']})"

        def x(key):
            v = p["speedup"][key]
            return f"{v:,.1f}x" if v else "-"

        s += (
            f"| {p['model']} | {c('h-nocache')} | {c('h-cache')} | {c('d-nocache')} | {c('d-cache')} | {x('h_cache_over_h_nocache')} "
            f"| {x('d_cache_over_d_nocache')} | {x('d_cache_over_h_cache')} | {x('h_nocache_over_d_nocache')} |\n"
        )
    s += (
        "\nThe paper (averages over the eight models): pipeline parallelism wins without a KV cache and tensor "
        "parallelism with one (Fig. 12a); D-NoCache 1.7x slower than H-NoCache; H-Cache 421x faster than "
        "H-NoCache, D-Cache 4.6Kx faster than D-NoCache and 7.9x faster than H-Cache (Fig. 12b).\n"
    )
    return s + _assumed_md(r)


def llm_sweep_md(r: dict) -> str:
    p = r["sweep"]
    title = {"seq-len": "sequence length (DockerSSD Fig. 13a/b)", "batch": "batch size (DockerSSD Fig. 13c/d)", "devices": "pool size"}[p]
    s = f"# Storage-pool LLM inference over {title}\n\n`{r['command']}`\n\n"
    s += f"{r['devices']} nodes; seconds per decode step; '-' = the KV cache does not fit a node's 400 GB.\n\n"
    s += f"| model | {p} | " + " | ".join(f"{x} s" for x in r["systems"]) + " | D-Cache / H-Cache |\n"
    s += "|---|---:|" + "---:|" * len(r["systems"]) + "---:|\n"
    for x in r["points"]:
        sp = x["speedup"]["d_cache_over_h_cache"]
        s += f"| {x['model']} | {x[p]} | " + " | ".join(fmt_s((x[k] or {}).get("step_s")) for k in r["systems"]) + f" | {f'{sp:.2f}x' if sp else '-'} |\n"
    if p == "seq-len":
        s += (
            "\nThe paper: at short sequences compute dominates and the drives run at about 60 % of the hosts' speed; "
            "the pool overtakes the hosts at 256 tokens for lamda and 1,024 for megatron; the speedup approaches "
            "about 9.5x for long sequences, and smaller models gain more.\n"
        )
    if p == "batch":
        s += (
            "\nThe paper: the KV cache grows linearly with the batch; D-Cache improves on H-Cache only modestly, "
            "at most 1.3x, for lamda and megatron. Its sequence length is not given; 256 tokens is assumed here.\n"
        )
    return s + _assumed_md(r)


def run_llm(out: str) -> None:
    for name, args in LLM_RUNS:
        r = plan(args)
        if "sweep" in r:
            r["benchmark"] = "plan-llm-sweep"
            report.write(r, name, llm_sweep_md, plots.llm_sweep, out)
        else:
            r["benchmark"] = "plan-llm-models"
            report.write(r, name, llm_models_md, plots.llm_models, out)


# ---------------------------------------------------------------------------------------
# Predictions against measurements


def validation_md(r: dict) -> str:
    m = r["machine"]
    s = "# Planner predictions against measured runs\n\n"
    s += f"Machine: {m.get('cpus')} cores ({m.get('cpu_model', '?')}), kernel {m.get('kernel', '?')}.\n\n"
    s += f"1. `{r['calibration_command']}` → `{os.path.basename(r['calibration_file'])}`\n"
    s += f"2. `{r['measured_command']}` (measured series)\n"
    s += f"3. `{r['ec_command']}` (measured erasure-coding series)\n\n"
    s += (
        "Predictions come from the calibration only (other data sizes for the kernels, other codes for the "
        "encoder); the error is the mean over all drive counts of |predicted − measured| / measured, host and "
        "drives together (largest in brackets). `here` follows the benchmark share by share on this machine; "
        "CSDPLAN is the paper's formula with the calibrated terms at the full size.\n\n"
    )
    s += "| kernel | data | error here | error CSDPLAN | BEP measured | BEP here | BEP CSDPLAN | BEP of the benchmark's own model |\n"
    s += "|---|---:|---:|---:|---:|---:|---:|---:|\n"
    for k in r["kernels"]:
        b, e, c = k["break_even"], k["error"], k["csdplan_error"]
        s += (
            f"| {k['kernel']} | {fmt_bytes(k['data_bytes'])} | {e['mean']:.1%} ({e['max']:.0%}) | {c['mean']:.1%} ({c['max']:.0%}) "
            f"| {b['measured'] or '> ' + str(len(k['measured']))} | {b['predicted'] or '-'} | {b['csdplan'] or '-'} | {b['benchmark_model'] or '-'} |\n"
        )
    if r.get("ec"):
        e = r["ec"]
        c = e["config"]
        s += (
            f"| EC ({c['n']},{c['k']}) RS, {fmt_bytes(c['block_bytes'])} blocks x {c['rounds']} stripes | | "
            f"{e['error']['mean']:.1%} ({e['error']['max']:.0%}) | | {e['break_even']['measured'] or '-'} | {e['break_even']['predicted'] or '-'} | | |\n"
        )
    s += "\nSeries (seconds, measured / predicted here):\n\n"
    n = max(len(k["measured"]) for k in r["kernels"])
    s += "| kernel | " + " | ".join(f"N={i} host" + " | " + f"N={i} drives" for i in range(1, n + 1)) + " |\n"
    s += "|---|" + "---:|" * (2 * n) + "\n"
    rows = [(k["kernel"], k["measured"], k["predicted"], "offload_s") for k in r["kernels"]]
    if r.get("ec"):
        rows.append(("EC", r["ec"]["measured"], r["ec"]["predicted"], "csd_s"))
    for name, meas, pred, dk in rows:
        cells = []
        for mp, pp in zip(meas, pred):
            cells += [f"{mp['host_s']:.3f} / {pp['host_s']:.3f}", f"{mp[dk]:.3f} / {pp['csd_s']:.3f}"]
        s += f"| {name} | " + " | ".join(cells) + " |\n"
    return s


def run_validate(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    cal_path = os.path.join(out, "plan-calibration.json")
    cal_args = ["calibrate", "--drive", "newport", "--link", "40gbe", "--out", cal_path]
    cmd = planner() + cal_args
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
        raise SystemExit("calibration failed")
    cal = report.load(cal_path)
    # The same allocator setting as the calibration's runs (see calibrate.BENCH_ENV).
    env = " ".join(f"{k}={v}" for k, v in calibrate.BENCH_ENV.items())
    print(f"+ {env} insitu bench break-even --drive newport --repeat 5 --json", file=sys.stderr, flush=True)
    os.environ.update(calibrate.BENCH_ENV)
    measured, _ = report.run(["bench", "break-even", "--drive", "newport", "--repeat", "5"])
    measured["command"] = f"{env} {measured['command']}"
    c = EC_CHECK
    rate = cal["drive"]["compute_rate"]
    ec_cmd = [
        sys.executable,
        "-m",
        "insitu.plan.ecbench",
        "series",
        str(c["n"]),
        str(c["k"]),
        str(c["block"]),
        str(c["rounds"]),
        repr(rate),
        str(c["max_drives"]),
        str(c["repeat"]),
    ]
    print("+ " + " ".join(ec_cmd), file=sys.stderr, flush=True)
    p = subprocess.run(ec_cmd, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit("the erasure-coding series failed")
    ec_measured = json.loads(p.stdout)
    r = {
        "benchmark": "plan-validation",
        "calibration_command": "insitu plan " + " ".join(cal_args[:-2] + ["--out", "bench/results/plan-calibration.json"]),
        "calibration_file": "bench/results/plan-calibration.json",
        "measured_command": measured["command"],
        "ec_command": "python -m insitu.plan.ecbench series " + " ".join(ec_cmd[4:]),
        "machine": measured.get("machine", {}),
        "measured_break_even": {
            "command": measured["command"],
            "models": measured.get("models"),
            "repeat": measured.get("repeat"),
            "kernels": [{k2: v for k2, v in k.items()} for k in measured["kernels"]],
        },
        "measured_ec": ec_measured,
        "kernels": validate.compare_kernels(cal, measured),
        "ec": validate.compare_ec(cal, ec_measured),
    }
    report.write(r, "plan-validation", validation_md, plots.validation, out)


WRITERS = {
    "plan-ec-sweep": (ec_md, plots.ec_sweep),
    "plan-llm-sweep": (llm_sweep_md, plots.llm_sweep),
    "plan-llm-models": (llm_models_md, plots.llm_models),
    "plan-validation": (validation_md, plots.validation),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="?", choices=["ec", "llm", "validate", "all"], help="which results to make")
    report.add_options(ap)
    a = ap.parse_args()
    if a.from_json:
        report.rerender(a.from_json, *WRITERS[report.load(a.from_json)["benchmark"]], a.out)
        return 0
    if not a.what:
        ap.error("name what to make: ec, llm, validate or all")
    if a.what in ("ec", "all"):
        run_ec(a.out)
    if a.what in ("llm", "all"):
        run_llm(a.out)
    if a.what in ("validate", "all"):
        run_validate(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
