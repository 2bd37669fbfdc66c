# SPDX-License-Identifier: Apache-2.0
"""Predicted against measured: the planner's calibrated predictions set beside series that
``insitu bench break-even`` and :func:`insitu.plan.ecbench.measure_series` measured on the
same machine.

The error of one series is the mean, over its points, of ``|predicted - measured| /
measured`` for both the host's and the drives' times (the maximum is reported too). The
break-even points are compared as whole numbers.
"""

from __future__ import annotations

from typing import List, Optional

from . import ec as ecplan
from . import kernels as kplan
from .csdplan import BreakEvenModel

__all__ = ["series_error", "compare_kernels", "compare_ec", "rust_model", "machine_cores", "copy_rate"]


def series_error(predicted: List[dict], measured: List[dict], keys=(("host_s", "host_s"), ("csd_s", "offload_s"))) -> dict:
    """Mean and largest relative error over the drive counts both series have."""
    by_n = {p["drives"]: p for p in predicted}
    errs = []
    for m in measured:
        p = by_n.get(m["drives"])
        if p is None:
            continue
        for pk, mk in keys:
            errs.append(abs(p[pk] - m[mk]) / m[mk])
    if not errs:
        return {"mean": None, "max": None, "points": 0}
    return {"mean": sum(errs) / len(errs), "max": max(errs), "points": len(errs)}


def rust_model(kernel_report: dict) -> BreakEvenModel:
    """The Python model with the Rust benchmark's own terms (its ``model`` object)."""
    m = kernel_report["model"]
    return BreakEvenModel(m["transfer_one_s"], m["transfer_link_s"], m["host_compute_s"], m["csd_one_s"])


def machine_cores(calibration: dict) -> Optional[float]:
    """The cores the emulated drives can use: the machine's CPUs. (What was free at the
    moment of calibration is recorded too, but other work comes and goes.)"""
    return (calibration.get("machine") or {}).get("cpus")


def copy_rate(calibration: dict) -> Optional[float]:
    """This machine's one-core memory copy rate, GB/s, when the calibration measured it."""
    return (calibration.get("host") or {}).get("memory_copy_gb_s")


def _measured_be(series: List[dict]) -> Optional[int]:
    return next((p["drives"] for p in series if p["offload_s"] < p["host_s"]), None)


def compare_kernels(calibration: dict, bench_report: dict) -> List[dict]:
    """For each kernel of a ``insitu bench break-even --json`` report: the calibrated
    predictions (``here`` and CSDPLAN's) beside the measured series."""
    cals = kplan.calibrations(calibration)
    link = (bench_report.get("models", {}).get("link") or {}).get("config", {}) or {}
    link_mb_s = link.get("mb_s")
    cores = machine_cores(calibration)
    out = []
    for k in bench_report["kernels"]:
        name, data, series = k["kernel"], k["data_bytes"], k["series"]
        if name not in cals:
            continue
        n = max(p["drives"] for p in series)
        here = kplan.predict_here(cals[name], data, link_mb_s, cores, n, copy_gb_s=copy_rate(calibration))
        csdplan = cals[name].csdplan(data, link_mb_s)
        err = series_error(here["points"], series)
        out.append(
            {
                "kernel": name,
                "data_bytes": data,
                "measured": [{"drives": p["drives"], "host_s": p["host_s"], "offload_s": p["offload_s"]} for p in series],
                "predicted": [{"drives": p["drives"], "host_s": p["host_s"], "csd_s": p["csd_s"]} for p in here["points"]],
                "csdplan": kplan.series(csdplan, n),
                "error": err,
                "csdplan_error": series_error(kplan.series(csdplan, n), series),
                "break_even": {
                    "measured": _measured_be(series),
                    "predicted": here["break_even"],
                    "csdplan": csdplan.break_even(),
                    "benchmark_model": k.get("break_even_model"),
                },
            }
        )
    return out


def compare_ec(calibration: dict, measured: dict) -> dict:
    """The calibrated prediction of a measured erasure-coding series (see
    :func:`insitu.plan.ecbench.measure_series`)."""
    c = measured["config"]
    pts = measured["points"]
    pred = ecplan.predict_here(calibration, c["n"], c["k"], c["block_bytes"], c["rounds"], max(p["drives"] for p in pts))
    err = series_error(pred["points"], pts, keys=(("host_s", "host_s"), ("csd_s", "csd_s")))
    meas_be = next((p["drives"] for p in pts if p["csd_s"] < p["host_s"]), None)
    return {
        "config": c,
        "measured": pts,
        "predicted": pred["points"],
        "error": err,
        "break_even": {"measured": meas_be, "predicted": pred["break_even"]},
        "host_encode_s": pred["host_encode_s"],
        "csd_to_host_ratio": pred["csd_to_host_ratio"],
    }
