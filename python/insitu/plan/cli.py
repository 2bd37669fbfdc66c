# SPDX-License-Identifier: Apache-2.0
"""``insitu plan scan|ec|llm|calibrate``: the planner's command line.

:func:`main` takes the arguments after ``plan``. Exit codes: 0 success, 1 a measurement
that failed while running (``calibrate``), 2 bad usage or input (the message says what to
change; with ``--json`` it is also printed as ``{"error": ...}``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Dict, List, Optional

from . import calibrate as calib
from . import ec as ecplan
from . import kernels as kplan
from . import llm as llmplan
from . import plots
from . import validate
from ._errors import MeasurementError, PlanError
from .inputs import EC_PROFILES, LINK_NAMES, drive as drive_preset, link_mb_s, number, number_list, positive_int, size, size_list
from .output import fmt_bytes, fmt_s, pyplot, save, table

__all__ = ["main"]

EPILOG_SCAN = """examples:
  insitu plan scan --kernel count --size 256M --host-mb-s 16000 --drive newport --link 40gbe
  insitu plan calibrate --out cal.json && insitu plan scan --kernel vector-add --calibration cal.json --json

Without --calibration the terms are the specification's: T_tx = size / the drive's host read
rate, T_link = size / the link, T_host = size / --host-mb-s, T_csd(1) = max(size / internal
read, T_host x --device-slowdown). With it, every term is measured (see insitu plan calibrate)
and a second prediction, `here`, follows the benchmark share by share on this machine."""

EPILOG_EC = """examples:
  insitu plan ec --blocks 48 --block-size 64M --device-compute 1 --json     # BEP 5
  insitu plan ec --blocks 48 --block-size 64M --device-compute 5 --json     # BEP 1
  insitu plan ec --sweep blocks --block-size 64M --plot ec-blocks.png
  insitu plan ec --blocks 24 --block-size 4M --drive newport --calibration cal.json

The encoded blocks are n + k with n = 2k: 12 = (8, 4), 24 = (16, 8), 48 = (32, 16).
--drive csdplan-ec is the paper's own host core and Newport CSD; a preset of `insitu model
list` encodes at its CPU budget against one EPYC 7352 core, or against this machine's core
with --calibration."""

EPILOG_LLM = """examples:
  insitu plan llm --model lamda-137b --seq-len 32K                  # Fig. 12 for one model
  insitu plan llm --model all --json                                # all eight models
  insitu plan llm --model lamda-137b,megatron-1t --sweep seq-len    # Fig. 13a/b
  insitu plan llm --model lamda-137b --sweep batch --seq-len 256    # Fig. 13c/d
  insitu plan llm --set host.kv_gb_s=2 --set drive.kv_gb_s=19.2

Systems: h-nocache, h-cache (KV cache swapped to an SSD), d-nocache, d-cache (KV cache in
the drives' flash). Every report lists the assumed inputs; --set NODE.FIELD=VALUE changes
one (fields: ghz, flops_per_cycle, efficiency, dram_gb, dram_gb_s, kv_gb, kv_gb_s,
net_gb_s, net_latency_us)."""

EPILOG_CALIBRATE = f"""examples:
  insitu plan calibrate                           # writes {calib.DEFAULT_OUT}
  insitu plan calibrate --drive smartssd --sizes 32M,64M --repeat 1 --out cal.json

Runs `insitu bench break-even --targets 2` at each --sizes (about 2-5 s each on 2 cores),
ISA-L encodes of the --ec configurations, and a memory copy and matrix multiply."""


#: Codes and block sizes ``calibrate`` times: around the paper's codes, 1-8 MiB blocks.
_EC_DEFAULT = "12:4M,36:4M,48:4M,24:1M,24:8M"


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so main() decides the exit code."""

    def error(self, message: str):
        raise _UsageError(f"{self.prog}: {message}\n{self.format_usage().strip()}")


class _UsageError(Exception):
    pass


def _arg(conv: Callable, *a) -> Callable[[str], object]:
    """An argparse type from a PlanError-raising converter."""

    def f(s: str):
        try:
            return conv(s, *a)
        except PlanError as e:
            # argparse names the option itself.
            msg = str(e)
            raise argparse.ArgumentTypeError(msg[len(a[0]) + 2 :] if a and msg.startswith(f"{a[0]}: ") else msg) from None

    return f


def _parser() -> _Parser:
    p = _Parser(
        prog="insitu plan", description="How many computational drives pay off (CSDPLAN, CSDPLAN-EC), and how a pool of them serves an LLM (DockerSSD)."
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    fmt = argparse.RawDescriptionHelpFormatter

    s = sub.add_parser(
        "scan",
        help="break-even drives for a plain kernel (CSDPLAN)",
        epilog=EPILOG_SCAN,
        formatter_class=fmt,
        description="CSDPLAN's break-even number of computational drives for count, vector-add, array-merge or pagerank.",
    )
    s.add_argument("--kernel", required=True, choices=kplan.KERNELS, help="the kernel (as insitu bench break-even runs it)")
    s.add_argument("--size", type=_arg(size, "--size"), help="data size (default: 256M; pagerank: 32M of edges)")
    s.add_argument("--drive", help="drive preset (default: newport, or the calibration's)")
    s.add_argument("--link", help=f"shared link: {', '.join(LINK_NAMES)}, MB/s or none (default: 40gbe, or the calibration's)")
    s.add_argument("--calibration", metavar="FILE", help="measured inputs from insitu plan calibrate")
    s.add_argument("--host-mb-s", type=_arg(number, "--host-mb-s"), help="host compute rate of the kernel on one core, MB/s (needed without --calibration)")
    s.add_argument(
        "--device-slowdown", type=_arg(number, "--device-slowdown"), help="drive compute time per host compute second (default: 1 / the preset's CPU budget)"
    )
    s.add_argument("--max-drives", type=_arg(positive_int, "--max-drives"), default=8, help="drives in the table (default 8)")
    s.add_argument("--json", action="store_true", help="print JSON")

    e = sub.add_parser(
        "ec",
        help="break-even drives for Reed-Solomon encoding (CSDPLAN-EC)",
        epilog=EPILOG_EC,
        formatter_class=fmt,
        description="CSDPLAN-EC: M (n, k) RS encodes on one host core vs on M computational drives.",
    )
    e.add_argument("--blocks", type=_arg(positive_int, "--blocks"), default=24, help="encoded blocks n + k (default 24 = (16, 8))")
    e.add_argument("--block-size", type=_arg(size, "--block-size"), default=64 << 20, help="bytes per block (default 64M)")
    e.add_argument("--device-compute", type=_arg(number, "--device-compute"), default=1.0, help="the drive's computational power, x (default 1)")
    e.add_argument("--host-compute", type=_arg(number, "--host-compute"), default=1.0, help="the host core's computational power, x (default 1)")
    e.add_argument("--drive", help=f"{', '.join(EC_PROFILES)} or a drive preset (default: csdplan-ec, or the calibration's drive)")
    e.add_argument("--parity", type=_arg(positive_int, "--parity"), help="parity blocks k (default: blocks / 3, so n = 2k)")
    e.add_argument("--transfer", action="store_true", help="count the first block set's transfer (the paper leaves it out)")
    e.add_argument("--calibration", metavar="FILE", help="this machine's measured ISA-L encoding (insitu plan calibrate)")
    e.add_argument("--max-drives", type=_arg(positive_int, "--max-drives"), default=8, help="drives in the series (default 8, or up to the break-even point)")
    e.add_argument("--sweep", choices=ecplan.SWEEPS, help='vary one input: prints a table, writes a plot and {"points": [...]}')
    e.add_argument("--values", help="sweep values, comma-separated (default: the paper's: blocks 12..48, block-size 16M..128M, device-compute 1..5)")
    e.add_argument("--plot", metavar="PNG", help="where the sweep's plot goes (default plan-ec-SWEEP.png)")
    e.add_argument("--no-plot", action="store_true", help="do not write the sweep's plot")
    e.add_argument("--json", action="store_true", help="print JSON")

    m = sub.add_parser(
        "llm",
        help="LLM inference on host processors vs a pool of computing drives (DockerSSD)",
        epilog=EPILOG_LLM,
        formatter_class=fmt,
        description="Time per decode step of distributed LLM inference: hosts vs drives, with and without a KV cache, over data/tensor/pipeline parallelism.",
    )
    m.add_argument("--model", default="lamda-137b", help=f"{', '.join(llmplan.MODELS)}, comma-separated, or all (default lamda-137b)")
    m.add_argument("--devices", type=_arg(positive_int, "--devices"), default=64, help="nodes in the pool (default 64; the paper: 16 to 128)")
    m.add_argument("--seq-len", type=_arg(size, "--seq-len"), default=32768, help="context length in tokens (default 32K)")
    m.add_argument("--batch-per-device", type=_arg(positive_int, "--batch-per-device"), default=1, help="sequences per node (default 1)")
    m.add_argument("--systems", default=",".join(llmplan.SYSTEMS), help="comma-separated subset of " + ", ".join(llmplan.SYSTEMS))
    m.add_argument("--sweep", choices=llmplan.SWEEPS, help='vary one input: prints a table, writes a plot and {"points": [...]}')
    m.add_argument("--values", help="sweep values, comma-separated (default: seq-len 64..32K, batch 1..512, devices 16..128)")
    m.add_argument("--set", action="append", default=[], metavar="NODE.FIELD=VALUE", help="change an assumed input, e.g. host.kv_gb_s=2")
    m.add_argument("--calibration", metavar="FILE", help="use this machine as the host (its measured matrix multiply and memory rates)")
    m.add_argument("--plot", metavar="PNG", help="where the sweep's plot goes (default plan-llm-SWEEP.png)")
    m.add_argument("--no-plot", action="store_true", help="do not write the sweep's plot")
    m.add_argument("--json", action="store_true", help="print JSON")

    c = sub.add_parser(
        "calibrate",
        help="measure this machine and write a calibration file",
        epilog=EPILOG_CALIBRATE,
        formatter_class=fmt,
        description="Short measured runs here (insitu bench break-even, ISA-L encodes, memory and matrix multiply) "
        "written as a calibration file for scan, ec and llm.",
    )
    c.add_argument("--drive", default="newport", help="drive preset the emulated drives use (default newport)")
    c.add_argument("--link", default="40gbe", help="shared link (default 40gbe)")
    c.add_argument(
        "--sizes",
        type=_arg(size_list, "--sizes"),
        default=[32 << 20, 64 << 20, 96 << 20, 128 << 20],
        help="data sizes for the kernels (default 32M,64M,96M,128M; PageRank gets 1/8 as edges)",
    )
    c.add_argument("--ec", default=_EC_DEFAULT, help=f"encodes to time, BLOCKS:BLOCK-SIZE comma-separated (n = 2k; default {_EC_DEFAULT})")
    c.add_argument("--repeat", type=_arg(positive_int, "--repeat"), default=5, help="measurements of each kind (default 5)")
    c.add_argument("--skip-kernels", action="store_true", help="no insitu bench break-even runs")
    c.add_argument("--skip-ec", action="store_true", help="no erasure-coding runs")
    c.add_argument("--skip-host", action="store_true", help="no memory copy or matrix multiply")
    c.add_argument("--dir", help="work directory for the benchmark's images (default: in /dev/shm)")
    c.add_argument("--out", default=calib.DEFAULT_OUT, help=f"calibration file to write (default {calib.DEFAULT_OUT})")
    c.add_argument("--json", action="store_true", help="print the calibration as JSON")
    return p


# ---------------------------------------------------------------------------------------
# scan


def _scan(a) -> dict:
    data = a.size or kplan.DEFAULT_SIZE[a.kernel]
    if a.calibration:
        if a.host_mb_s is not None or a.device_slowdown is not None:
            raise PlanError("--host-mb-s and --device-slowdown replace a calibration's measurements; give either them or --calibration")
        cal = calib.load(a.calibration)
        cal_drive = cal.get("drive", {}).get("name")
        if a.drive and a.drive != cal_drive:
            raise PlanError(f"--calibration {a.calibration} was measured with drive {cal_drive}; run `insitu plan calibrate --drive {a.drive}` for {a.drive}")
        link_name = a.link or cal.get("link", {}).get("name", "40gbe")
        link = link_mb_s(link_name)
        cals = kplan.calibrations(cal)
        if a.kernel not in cals:
            raise PlanError(f"--calibration {a.calibration} has no {a.kernel} measurements")
        kc = cals[a.kernel]
        model = kc.csdplan(data, link)
        here = kplan.predict_here(kc, data, link, validate.machine_cores(cal), a.max_drives, copy_gb_s=validate.copy_rate(cal))
        inputs = {"source": f"calibration {a.calibration}", "drive": cal_drive, "calibrated_sizes": list(kc.sizes)}
    else:
        if a.host_mb_s is None:
            raise PlanError("--host-mb-s is needed without --calibration (the kernel's rate on one host core, MB/s); or measure it: insitu plan calibrate")
        d = drive_preset(a.drive or "newport")
        link_name = a.link or "40gbe"
        link = link_mb_s(link_name)
        slowdown = a.device_slowdown if a.device_slowdown is not None else 1.0 / (d.compute_rate or 1.0)
        model = kplan.spec_model(data, a.host_mb_s, slowdown, d.host_read_mb_s, d.internal_read_mb_s, link)
        here = None
        inputs = {"source": "flags and drive preset", "drive": d.as_dict(), "host_mb_s": a.host_mb_s, "device_slowdown": slowdown}
    be = model.break_even()
    r = {
        "kernel": a.kernel,
        "data_bytes": data,
        "link": link_name,
        "link_mb_s": link,
        "break_even": be,
        "inputs": {
            **inputs,
            "transfer_one_s": model.transfer_one_s,
            "transfer_link_s": model.transfer_link_s,
            "host_compute_s": model.host_compute_s,
            "csd_one_s": model.csd_one_s,
        },
        "link_bound_from_drives": model.link_bound_from() if model.transfer_link_s > 0 else None,
        "model": "T_host(M) = max(T_tx/M, T_link) + T_host_comp; T_csd(M) = T_csd(1)/M; break_even = least M with T_csd(M) < T_host(M)",
        "points": kplan.series(model, max(a.max_drives, be or 0) if (be or 0) <= 64 else a.max_drives),
    }
    if here is not None:
        r["here"] = here
    return r


def _scan_text(r: dict) -> str:
    s = (
        f"{r['kernel']}, {fmt_bytes(r['data_bytes'])}, link {r['link']}: break-even at "
        f"{r['break_even'] if r['break_even'] else 'no array size'} drive(s) (CSDPLAN)\n"
    )
    i = r["inputs"]
    s += (
        f"inputs ({i['source']}): T_tx {fmt_s(i['transfer_one_s'])} s, T_link {fmt_s(i['transfer_link_s'])} s, "
        f"T_host_comp {fmt_s(i['host_compute_s'])} s, T_csd(1) {fmt_s(i['csd_one_s'])} s\n\n"
    )
    here = {p["drives"]: p for p in r.get("here", {}).get("points", [])}
    head = ["drives", "host s", "CSDs s"] + (["host s (here)", "CSDs s (here)"] if here else [])
    rows = []
    for p in r["points"]:
        row = [p["drives"], fmt_s(p["host_s"]), fmt_s(p["csd_s"])]
        if here:
            h = here.get(p["drives"])
            row += [fmt_s(h["host_s"]), fmt_s(h["csd_s"])] if h else ["", ""]
        rows.append(row)
    s += table(head, rows)
    if here:
        s += f"\nhere (share by share, this machine's limits): break-even at {r['here']['break_even'] or '-'} drive(s)\n"
    return s


# ---------------------------------------------------------------------------------------
# ec


def _ec_args(a, cal: Optional[dict]) -> dict:
    drive = a.drive or ((cal or {}).get("drive", {}).get("name") if cal else None) or "csdplan-ec"
    return {
        "blocks": a.blocks,
        "block_bytes": a.block_size,
        "device_compute": a.device_compute,
        "host_compute": a.host_compute,
        "drive": drive,
        "parity": a.parity,
        "transfer": a.transfer,
        "calibration": cal,
        "max_drives": a.max_drives,
    }


def _ec_values(param: str, text: Optional[str]) -> List[float]:
    if text is None:
        return list(ecplan.DEFAULT_VALUES[param])
    if param == "block-size":
        return size_list(text, "--values")
    vals = number_list(text, "--values")
    if param == "blocks" and any(v != int(v) for v in vals):
        raise PlanError("--values: block counts are whole numbers")
    return vals


def _ec_plot(r: dict, path: str) -> Optional[str]:
    plt = pyplot()
    return save(plots.ec_sweep(r, plt), plt, path) if plt else None


def _ec(a) -> dict:
    cal = calib.load(a.calibration) if a.calibration else None
    args = _ec_args(a, cal)
    if a.sweep:
        r = ecplan.sweep(a.sweep, _ec_values(a.sweep, a.values), **args)
        r["plot"] = None if a.no_plot else _ec_plot(r, a.plot or f"plan-ec-{a.sweep}.png")
        return r
    if a.values or a.plot:
        raise PlanError("--values and --plot go with --sweep")
    return ecplan.plan(**args)


def _ec_text(r: dict) -> str:
    if "sweep" in r:
        p = r["sweep"]
        rows = [
            [
                fmt_bytes(x[p]) if p == "block-size" else f"{x[p]:g}",
                f"({x['n']},{x['k']})",
                fmt_s(x["host_encode_s"]),
                fmt_s(x["csd_encode_s"]),
                x["break_even"] or "-",
            ]
            for x in r["points"]
        ]
        s = f"CSDPLAN-EC sweep over {p} (drive {r['inputs']['drive']})\n\n"
        s += table([p, "(n, k)", "host encode s", "CSD encode s", "break-even"], rows)
        return s + (f"\nplot: {r['plot']}\n" if r.get("plot") else "")
    s = (
        f"({r['n']},{r['k']}) RS, {r['blocks']} blocks of {fmt_bytes(r['block_bytes'])}, drive {r['drive']}, "
        f"device x{r['device_compute']:g}, host x{r['host_compute']:g}: break-even at {r['break_even'] or '-'} drive(s)\n"
    )
    s += f"one encode: host {fmt_s(r['host_encode_s'])} s, CSD {fmt_s(r['csd_encode_s'])} s\n"
    s += f"inputs: {r['source']}\n\n"
    s += table(["drives", "SSD system s", "CSD system s"], [[p["drives"], fmt_s(p["host_s"]), fmt_s(p["csd_s"])] for p in r["series"]])
    return s


# ---------------------------------------------------------------------------------------
# llm

_NODE_FIELDS = ("ghz", "flops_per_cycle", "efficiency", "dram_gb", "dram_gb_s", "kv_gb", "kv_gb_s", "net_gb_s", "net_latency_us")
_LLM_DEFAULT_VALUES = {
    "seq-len": [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768],
    "batch": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
    "devices": [16, 32, 64, 128],
}


def _overrides(sets: List[str]) -> Dict[str, Dict[str, float]]:
    out: Dict[str, Dict[str, float]] = {}
    for s in sets:
        key, eq, val = s.partition("=")
        node, dot, field = key.strip().partition(".")
        if not eq or not dot or node not in llmplan.NODES or field not in _NODE_FIELDS:
            raise PlanError(f"--set {s}: write NODE.FIELD=VALUE with NODE host or drive and FIELD one of {', '.join(_NODE_FIELDS)}")
        out.setdefault(node, {})[field] = number(val, f"--set {key}")
    return out


def _models(text: str) -> List[str]:
    names = list(llmplan.MODELS) if text.strip() == "all" else [m.strip() for m in text.split(",") if m.strip()]
    for n in names:
        if n not in llmplan.MODELS:
            raise PlanError(f"--model {n}: unknown; choose from {', '.join(llmplan.MODELS)} or all")
    if not names:
        raise PlanError("--model: name at least one model")
    return names


def _llm_plot(r: dict, path: str) -> Optional[str]:
    plt = pyplot()
    return save(plots.llm_sweep(r, plt), plt, path) if plt else None


def _llm(a) -> dict:
    models = _models(a.model)
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    for s in systems:
        if s not in llmplan.SYSTEMS:
            raise PlanError(f"--systems {s}: choose from {', '.join(llmplan.SYSTEMS)}")
    nodes = llmplan.nodes_with(_overrides(a.set), calib.load(a.calibration) if a.calibration else None)
    if a.sweep:
        vals = _LLM_DEFAULT_VALUES[a.sweep] if a.values is None else [int(size(v.strip(), "--values")) for v in a.values.split(",") if v.strip()]
        if not vals:
            raise PlanError("--values: give at least one value")
        points = []
        for m in models:
            r = llmplan.sweep(a.sweep, vals, m, a.devices, a.seq_len, a.batch_per_device, nodes, systems)
            points += [{"model": m, **p} for p in r["points"]]
        out = {
            "sweep": a.sweep,
            "models": models,
            "systems": systems,
            "devices": a.devices,
            "seq_len": a.seq_len,
            "batch_per_device": a.batch_per_device,
            "points": points,
            **llmplan.assumptions(nodes),
        }
        out["plot"] = None if a.no_plot else _llm_plot(out, a.plot or f"plan-llm-{a.sweep}.png")
        return out
    if a.values or a.plot:
        raise PlanError("--values and --plot go with --sweep")
    plans = [llmplan.plan(m, a.devices, a.seq_len, a.batch_per_device, nodes, systems) for m in models]
    out = plans[0] if len(plans) == 1 else {"models": plans}
    return {**out, **llmplan.assumptions(nodes)}


def _llm_text(r: dict) -> str:
    if "sweep" in r:
        p = r["sweep"]
        head = ["model", p] + [f"{s} s" for s in r["systems"]] + ["D-Cache / H-Cache"]
        rows = []
        for x in r["points"]:
            sp = x["speedup"]["d_cache_over_h_cache"]
            rows.append([x["model"], x[p]] + [fmt_s((x[s] or {}).get("step_s")) for s in r["systems"]] + [f"{sp:.2f}x" if sp else "-"])
        s = f"seconds per decode step ({r['devices']} nodes; '-' = does not fit)\n\n" + table(head, rows)
        return s + (f"\nplot: {r['plot']}\n" if r.get("plot") else "")
    plans = r["models"] if "models" in r else [r]
    s = ""
    for pl in plans:
        s += f"{pl['model']} ({pl['params_b']:.0f}B), {pl['devices']} nodes, seq {pl['seq_len']}, {pl['batch_per_device']} sequence(s) per node\n"
        rows = []
        for name, v in pl["systems"].items():
            rows.append(
                [name, "does not fit"] + [""] * 5
                if v is None
                else [
                    name,
                    fmt_s(v["step_s"]),
                    f"{v['dp']}x{v['tp']}x{v['pp']}",
                    v["dominant"],
                    fmt_s(v["compute_s"]),
                    fmt_s(v["memory_s"]),
                    fmt_s(v["comm_s"]),
                ]
            )
        s += table(["system", "step s", "dp x tp x pp", "parallelism", "compute s", "memory s", "comm s"], rows)
        sp = {k: v for k, v in pl["speedup"].items() if v}
        s += "speedups: " + ", ".join(f"{k} {v:,.2f}x" for k, v in sp.items()) + "\n\n"
    s += "assumed (not in the paper): " + "; ".join(f"{k} = {v['value']}" for k, v in r["assumed"].items()) + "\n"
    return s


# ---------------------------------------------------------------------------------------
# calibrate


def _ec_configs(text: str):
    out = []
    for part in [p for p in text.split(",") if p.strip()]:
        blocks, colon, bs = part.strip().partition(":")
        if not colon:
            raise PlanError(f"--ec {part}: write BLOCKS:BLOCK-SIZE, e.g. 24:1M")
        n, k = ecplan.code(positive_int(blocks, "--ec"))
        out.append((n, k, size(bs, "--ec")))
    if not out:
        raise PlanError("--ec: give at least one BLOCKS:BLOCK-SIZE")
    return out


def _calibrate(a) -> dict:
    link_mb_s(a.link)  # a bad link fails before anything runs
    ec_configs = _ec_configs(a.ec)
    doc = calib.run(
        a.drive,
        a.link,
        a.sizes,
        ec_configs,
        a.repeat,
        kernels=not a.skip_kernels,
        ec=not a.skip_ec,
        host=not a.skip_host,
        work_dir=a.dir,
        progress=lambda s: print(s, file=sys.stderr, flush=True),
    )
    doc["command"] = "insitu plan " + " ".join(_ARGV)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2)
    doc["written"] = a.out
    return doc


def _calibrate_text(doc: dict) -> str:
    s = f"calibration written to {doc['written']} (drive {doc['drive']['name']}, link {doc['link']['name']})\n"
    for name, k in doc["kernels"].items():
        for x in k["samples"]:
            s += (
                f"  {name:12s} {fmt_bytes(x['data_bytes']):>8s}: host {fmt_s(x['host_compute_s'])} s, "
                f"one CSD {fmt_s(x['csd_one_s'])} s, pull 1/2 drives {fmt_s(x['pull_one_s'])}/{fmt_s(x['pull_two_s'])} s\n"
            )
    if doc.get("ec"):
        c = doc["ec"]["host_cost"]
        s += (
            f"  EC host cost: {c['fixed_s']:.2e} s + {c['per_byte_s']:.2e} s/byte + {c['per_mac_s']:.2e} s/MAC; "
            f"device/host {doc['ec'].get('device_to_host_ratio') or 0:.2f}x\n"
        )
    if doc.get("host"):
        h = doc["host"]
        s += f"  host: memory copy {h['memory_copy_gb_s']:.1f} GB/s, matrix multiply {h['gemm_gflops'] or 0:.0f} GFLOP/s\n"
    return s


# ---------------------------------------------------------------------------------------

_ARGV: List[str] = []
_COMMANDS = {"scan": (_scan, _scan_text), "ec": (_ec, _ec_text), "llm": (_llm, _llm_text), "calibrate": (_calibrate, _calibrate_text)}


def main(argv: List[str]) -> int:
    """Runs ``insitu plan ARGV``; returns the exit code."""
    global _ARGV
    _ARGV = list(argv)
    want_json = "--json" in argv
    try:
        a = _parser().parse_args(argv)
    except _UsageError as e:
        return _fail(str(e), want_json)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    run, text = _COMMANDS[a.command]
    try:
        r = run(a)
    except MeasurementError as e:
        return _fail(f"insitu plan {a.command}: {e}", want_json, code=1)
    except PlanError as e:
        return _fail(f"insitu plan {a.command}: {e}", want_json)
    except OSError as e:
        return _fail(f"insitu plan {a.command}: {e}", want_json, code=1)
    try:
        if a.json:
            print(json.dumps(r, indent=2))
        else:
            sys.stdout.write(text(r))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader (e.g. `head`) has gone; nothing more to say.
        sys.stdout = open("/dev/null", "w")
    return 0


def _fail(msg: str, want_json: bool, code: int = 2) -> int:
    print(msg, file=sys.stderr)
    if want_json:
        print(json.dumps({"error": msg}))
    return code
