# SPDX-License-Identifier: Apache-2.0
"""``insitu plan calibrate``: short measured runs on this machine, written to a calibration
file that ``insitu plan scan|ec|llm --calibration FILE`` read.

* **Kernels.** ``insitu bench break-even --targets 2`` at each of a few data sizes (PageRank
  gets an eighth as edge data, as the benchmark's defaults do): per kernel and size, the
  host compute (in memory, and on just-pulled shares of one and two drives), the kernel's
  CPU time under the drive's budget, one drive's EXEC, one drive's pull and two drives'
  pull.
* **Erasure coding.** ISA-L encodes of a few (n, k = n/2, block) configurations on one host
  core, fitted to an :class:`~insitu.plan.csdplan.EncodeCost`, and one encode under the
  drive's CPU budget (the measured device/host ratio).
* **Machine.** The cores a busy process per CPU gets right now, recorded with a warning
  when other work shares the machine (measurements then may not match later runs).
* **Host.** The copy bandwidth of this machine's memory and, when numpy is installed, its
  matrix-multiply rate, for ``plan llm``.

The file is JSON (``"calibration": 1``); it records the drive and link it was measured
with, the machine and the exact commands.
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from typing import Callable, List, Optional, Tuple

from ._errors import MeasurementError, PlanError
from . import ecbench
from .inputs import Drive, drive as drive_preset, link_mb_s

__all__ = ["DEFAULT_OUT", "FORMAT", "BENCH_ENV", "run", "load", "insitu_command", "available_cores"]

#: Where ``calibrate`` writes unless told otherwise.
DEFAULT_OUT = "plan-calibration.json"
#: The calibration file's format version.
FORMAT = 1
#: Environment of the benchmark runs. glibc's malloc raises its mmap threshold as a process
#: frees big buffers, so a buffer's cost (fresh pages or reused heap) would depend on what
#: the process ran before; pinned at its default, it depends on the buffer's size alone.
BENCH_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def insitu_command() -> List[str]:
    """The ``insitu`` command: ``$INSITU`` when set, else this interpreter's package."""
    env = os.environ.get("INSITU")
    return shlex.split(env) if env else [sys.executable, "-m", "insitu"]


def _bench_break_even(drive: str, link: str, data: int, repeat: int, work_dir: Optional[str]) -> dict:
    args = [
        "bench",
        "break-even",
        "--drive",
        drive,
        "--link",
        link,
        "--targets",
        "2",
        "--size",
        str(data),
        "--graph-size",
        str(max(data // 8, 64)),
        "--repeat",
        str(repeat),
        "--json",
    ]
    if work_dir:
        args += ["--dir", work_dir]
    cmd = insitu_command() + args
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **BENCH_ENV})
    if p.returncode != 0 or not p.stdout.strip():
        last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit code {p.returncode}"
        raise MeasurementError(f"`insitu {' '.join(args)}` failed: {last}")
    r = json.loads(p.stdout)
    r["command"] = " ".join(f"{k}={v}" for k, v in BENCH_ENV.items()) + " insitu " + " ".join(args)
    return r


def _kernel_samples(report: dict) -> List[Tuple[str, dict]]:
    out = []
    for k in report["kernels"]:
        s = {p["drives"]: p for p in k["series"]}
        out.append(
            (
                k["kernel"],
                {
                    "data_bytes": k["data_bytes"],
                    "host_compute_s": k["host_compute_s"],
                    "host_compute_cpu_s": k["host_compute_cpu_s"],
                    # The host's compute on shares it has just pulled, as the benchmark's host pass
                    # runs it: one share of data_bytes, and two of half of it.
                    "host_compute_pulled_s": s[1]["host_compute_s"],
                    "host_compute_two_s": s[2]["host_compute_s"] if 2 in s else None,
                    "device_compute_s": k["device_compute_s"],
                    "device_compute_cpu_s": k["device_compute_cpu_s"],
                    "csd_one_s": s[1]["offload_s"],
                    "pull_one_s": s[1]["host_pull_s"],
                    "pull_two_s": s[2]["host_pull_s"] if 2 in s else None,
                },
            )
        )
    return out


def _memory_copy_gb_s(size: int = 256 << 20, repeat: int = 3) -> float:
    """The fastest of ``repeat`` one-core copies of ``size`` bytes, GB/s (read + write
    counted once, as a stream)."""
    src = ctypes.create_string_buffer(size)
    dst = ctypes.create_string_buffer(size)
    ctypes.memmove(dst, src, size)  # touch every page first
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        ctypes.memmove(dst, src, size)
        best = min(best, time.perf_counter() - t)
    return size / best / 1e9


_SPIN = "import time\nt = time.monotonic() + {s}\nwhile time.monotonic() < t: pass\nprint(time.process_time())"


def available_cores(seconds: float = 0.5) -> float:
    """Cores this machine gives a busy process each of its CPUs right now: CPU seconds
    that one spinning process per CPU got, divided by the wall time. Other work on a
    shared machine lowers it; the emulated drives share what is left."""
    cpus = os.cpu_count() or 1
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN.format(s=seconds)], stdout=subprocess.PIPE, text=True) for _ in range(cpus)]
    got = 0.0
    for p in procs:
        out, _ = p.communicate()
        try:
            got += float(out.strip())
        except ValueError:
            pass
    return min(float(cpus), got / seconds)


def _gemm_gflops(n: int = 1024, repeat: int = 3) -> Optional[float]:
    """float32 matrix multiply rate with numpy (all its threads), or None without numpy."""
    try:
        import numpy as np
    except ImportError:
        return None
    a = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    a @ a
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def run(
    drive: str,
    link: str,
    sizes: List[int],
    ec_configs: List[Tuple[int, int, int]],
    repeat: int,
    kernels: bool = True,
    ec: bool = True,
    host: bool = True,
    work_dir: Optional[str] = None,
    progress: Callable[[str], None] = lambda s: None,
) -> dict:
    """Measures and returns the calibration document (see the module docs)."""
    d: Drive = drive_preset(drive)
    link_rate = link_mb_s(link)
    doc: dict = {
        "calibration": FORMAT,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "drive": d.as_dict(),
        "link": {"name": link, "mb_s": link_rate},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "commands": [],
        "kernels": {},
        "ec": None,
        "host": None,
    }
    free = doc["machine"]["available_cores"] = available_cores()
    if free < 0.9 * (os.cpu_count() or 1):
        progress(f"warning: other work is using this machine ({free:.1f} of {os.cpu_count()} cores free); measurements taken now may not match later runs")
    if kernels:
        for size in sorted(set(sizes)):
            progress(f"insitu bench break-even at {size >> 20} MiB ({drive}, {link}, 2 drives) ...")
            r = _bench_break_even(drive, link, size, repeat, work_dir)
            doc["commands"].append(r["command"])
            doc["machine"] = {**doc["machine"], **r.get("machine", {})}
            for name, sample in _kernel_samples(r):
                doc["kernels"].setdefault(name, {"samples": []})["samples"].append(sample)
    if ec:
        if not ecbench.available():
            progress("ISA-L not found: skipped erasure coding (apt-get install libisal2)")
        else:
            progress("ISA-L encodes on one core ...")
            doc["ec"] = ecbench.calibrate_ec(ec_configs, d.compute_rate, repeat, progress)
            doc["ec"]["drive_rate"] = d.compute_rate
    if host:
        progress("memory copy and matrix multiply ...")
        doc["host"] = {"memory_copy_gb_s": _memory_copy_gb_s(), "gemm_gflops": _gemm_gflops()}
    return doc


def load(path: str) -> dict:
    """A calibration file, checked for its format; a PlanError saying how to make one."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise PlanError(f"--calibration {path}: no such file; write one with `insitu plan calibrate --out {path}`") from None
    except (OSError, ValueError) as e:
        raise PlanError(f"--calibration {path}: cannot read it as JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("calibration") != FORMAT:
        raise PlanError(f"--calibration {path}: not an insitu calibration (format {FORMAT}); write one with `insitu plan calibrate`")
    return doc
