# SPDX-License-Identifier: Apache-2.0
"""Measured Reed-Solomon encoding on this machine, for calibration and for checking the
CSDPLAN-EC model against real runs.

Encoding is ISA-L's ``ec_encode_data`` (the library CSDPLAN-EC used), called through
ctypes on a Cauchy generator matrix, so any (n, k) works. Blocks are encoded in column
slices (:func:`slice_bytes`: about a millisecond of work each), as storage systems encode
stripe units.

A *computational drive* is a worker process that encodes its own block set under the drive
model's CPU budget: after each slice it sleeps until its CPU time divided by the budget's
rate (``workers x cpu_share`` host cores, as the Rust ``ComputeBudget`` allows) has passed
since it began. The *host* is one process encoding every drive's block set in turn on one
core (CSDPLAN-EC's SSD(1)). Data is in memory on both sides: the paper's model leaves the
block transfer out, and so does the measurement.

``python -m insitu.plan.ecbench series N K BLOCK ROUNDS RATE MAX_DRIVES REPEAT`` prints a
measured series as JSON; ``... worker ...`` is one worker, which the parent drives through
its standard input and output.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import random
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from ._errors import MeasurementError, PlanError
from .csdplan import EncodeCost

__all__ = ["available", "Encoder", "time_encode", "measure_series", "fit_cost", "calibrate_ec"]

_LIB: Optional[ctypes.CDLL] = None


def _lib() -> ctypes.CDLL:
    """ISA-L, loaded once; a PlanError saying what to install when it is missing."""
    global _LIB
    if _LIB is None:
        names = [n for n in ("libisal.so.2", ctypes.util.find_library("isal")) if n]
        for n in names:
            try:
                _LIB = ctypes.CDLL(n)
                break
            except OSError:
                continue
        if _LIB is None:
            raise PlanError(
                "ISA-L (libisal) is not installed: `apt-get install libisal2` (make deps does), or plan from presets without measured erasure coding"
            )
    return _LIB


def available() -> bool:
    """Whether ISA-L can be loaded."""
    try:
        _lib()
        return True
    except PlanError:
        return False


#: Multiply-accumulates per column slice: about a millisecond of one core, so that a
#: budgeted drive's stalls are long next to the timer's granularity.
_SLICE_MACS = 32 << 20


def slice_bytes(n: int, k: int, block: int) -> int:
    """Column slice width for an (n, k) code: about :data:`_SLICE_MACS` multiply-accumulates,
    a multiple of 64 KiB, at most the block."""
    per = -(-_SLICE_MACS // (n * k))
    return max(1, min(block, -(-per // (64 << 10)) * (64 << 10)))


class Encoder:
    """n data blocks of ``block`` bytes (random) and k parity blocks, with ISA-L's tables
    for a systematic Cauchy code. ``chunk`` is the column slice width (0: by
    :func:`slice_bytes`)."""

    def __init__(self, n: int, k: int, block: int, chunk: int = 0):
        lib = _lib()
        if n < 1 or k < 1 or n + k > 255:
            raise PlanError(f"an (n, k) code needs n >= 1, k >= 1 and n + k <= 255 (got n={n}, k={k})")
        self.n, self.k, self.block = n, k, block
        self.chunk = max(1, min(chunk, block)) if chunk else slice_bytes(n, k, block)
        a = (ctypes.c_ubyte * ((n + k) * n))()
        lib.gf_gen_cauchy1_matrix(a, n + k, n)
        self._tables = (ctypes.c_ubyte * (32 * n * k))()
        # Rows n.. of the generator make the parity; the first n are the identity.
        lib.ec_init_tables(n, k, ctypes.byref(a, n * n), self._tables)
        # Pseudo-random data: as good as any for RS, and much faster to make than urandom.
        rng = random.Random(n * 1_000_003 + k * 1009 + block)
        self._data = [ctypes.create_string_buffer(rng.randbytes(block), block) for _ in range(n)]
        self._parity = [ctypes.create_string_buffer(block) for _ in range(k)]
        self._addr = [ctypes.addressof(b) for b in self._data], [ctypes.addressof(b) for b in self._parity]

    def encode(self, budget_rate: Optional[float] = None, rounds: int = 1) -> float:
        """Encodes every block ``rounds`` times, slice by slice, as one job; with
        ``budget_rate`` it stalls so that its CPU time never exceeds ``budget_rate`` x the
        wall time since the job began. Returns the CPU seconds used."""
        lib, n, k = _lib(), self.n, self.k
        t0, c0 = time.monotonic(), time.thread_time()
        for _ in range(rounds):
            for off in range(0, self.block, self.chunk):
                length = min(self.chunk, self.block - off)
                dp = (ctypes.c_void_p * n)(*[a + off for a in self._addr[0]])
                pp = (ctypes.c_void_p * k)(*[a + off for a in self._addr[1]])
                lib.ec_encode_data(length, n, k, self._tables, dp, pp)
                if budget_rate:
                    # The leaky bucket of the Rust ComputeBudget for one thread that
                    # computes the whole time: it may not finish before cpu / rate has
                    # passed since it began.
                    pause = t0 + (time.thread_time() - c0) / budget_rate - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
        return time.thread_time() - c0

    def parity(self, i: int) -> bytes:
        """Parity block ``i`` (for checks)."""
        return bytes(self._parity[i])

    def data(self, i: int) -> bytes:
        return bytes(self._data[i])


def time_encode(n: int, k: int, block: int, repeat: int = 3, min_s: float = 0.05, chunk: int = 0) -> Tuple[float, float]:
    """The fastest wall and CPU seconds of one encode on this core (this machine is shared;
    the fastest run is the least disturbed). Short encodes are repeated until a run lasts
    ``min_s`` and divided."""
    enc = Encoder(n, k, block, chunk)
    enc.encode()  # warm the tables and the pages
    t = time.monotonic()
    enc.encode()
    once = max(time.monotonic() - t, 1e-6)
    loops = max(1, int(min_s / once))
    best_wall = best_cpu = float("inf")
    for _ in range(max(1, repeat)):
        t, cpu = time.monotonic(), 0.0
        for _ in range(loops):
            cpu += enc.encode()
        best_wall = min(best_wall, (time.monotonic() - t) / loops)
        best_cpu = min(best_cpu, cpu / loops)
    return best_wall, best_cpu


# ---------------------------------------------------------------------------------------
# Worker processes.


def _worker(argv: Sequence[str]) -> int:
    n, k, block, rounds, chunk = (int(x) for x in argv[:5])
    rate = float(argv[5]) if len(argv) > 5 and argv[5] != "none" else None
    enc = Encoder(n, k, block, chunk)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    cpu = enc.encode(rate, rounds)
    print(json.dumps({"end": time.monotonic(), "cpu_s": cpu}), flush=True)
    return 0


def _spawn(n: int, k: int, block: int, rounds: int, chunk: int, rate: Optional[float]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "insitu.plan.ecbench", "worker", str(n), str(k), str(block), str(rounds), str(chunk), "none" if rate is None else repr(rate)]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _run_together(procs: List[subprocess.Popen]) -> Tuple[float, float]:
    """Starts every ready worker at once; returns (wall seconds until the last finished,
    CPU seconds of all)."""
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise MeasurementError("an encoding worker failed to start (see the error above)")
        t = time.monotonic()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        ends, cpu = [], 0.0
        for p in procs:
            line = p.stdout.readline()
            if not line:
                raise MeasurementError("an encoding worker died (see the error above)")
            r = json.loads(line)
            ends.append(r["end"])
            cpu += r["cpu_s"]
        return max(ends) - t, cpu
    finally:
        for p in procs:
            if p.poll() is None:
                p.stdin.close()
            p.wait()


def measure_series(n: int, k: int, block: int, rounds: int, rate: float, max_drives: int, repeat: int = 5, chunk: int = 0, progress=None) -> List[dict]:
    """For M = 1..max_drives: the host encoding M block sets (``rounds`` passes each) one
    after another, and M budgeted drives encoding one set each at once. The fastest of
    ``repeat`` runs of each (this machine is shared; the fastest is the least disturbed)."""
    pts = []
    for m in range(1, max_drives + 1):
        hosts, csds, csd_cpu = [], [], 0.0
        for _ in range(max(1, repeat)):
            wall, _ = _run_together([_spawn(n, k, block, rounds * m, chunk, None)])
            hosts.append(wall)
            wall, cpu = _run_together([_spawn(n, k, block, rounds, chunk, rate) for _ in range(m)])
            csds.append(wall)
            csd_cpu = cpu
        p = {"drives": m, "host_s": min(hosts), "csd_s": min(csds), "csd_cpu_s": csd_cpu}
        pts.append(p)
        if progress:
            progress(f"  EC ({n},{k}) x {block >> 10} KiB, {m} drive(s): host {p['host_s']:.3f} s, CSDs {p['csd_s']:.3f} s")
    return pts


# ---------------------------------------------------------------------------------------
# Fitting an EncodeCost.


def _solve(a: List[List[float]], b: List[float]) -> Optional[List[float]]:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-300:
            return None
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                for j in range(c, n + 1):
                    m[r][j] -= f * m[c][j]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit_cost(samples: List[Tuple[int, int, int, float]]) -> EncodeCost:
    """The :class:`EncodeCost` with non-negative terms that minimises the squared
    *relative* error over ``(n, k, block, seconds)`` samples (every subset of terms is
    tried; the best feasible one wins)."""
    if not samples:
        raise PlanError("no erasure-coding samples to fit")
    rows = [((1.0, float((n + k) * b), float(n * k * b)), t) for n, k, b, t in samples]
    best: Optional[Tuple[float, List[float]]] = None
    for mask in range(1, 8):
        cols = [i for i in range(3) if mask >> i & 1]
        # Weighted least squares, weight 1/t: relative error.
        ata = [[sum(x[i] * x[j] / t**2 for x, t in rows) for j in cols] for i in cols]
        atb = [sum(x[i] / t for x, t in rows) for i in cols]
        sol = _solve(ata, atb)
        if sol is None or any(v < 0 for v in sol):
            continue
        coef = [0.0, 0.0, 0.0]
        for i, v in zip(cols, sol):
            coef[i] = v
        err = sum((sum(c * xi for c, xi in zip(coef, x)) / t - 1) ** 2 for x, t in rows)
        if best is None or err < best[0]:
            best = (err, coef)
    if best is None:
        raise PlanError("cannot fit an encoding cost to the samples")
    return EncodeCost(*best[1])


def calibrate_ec(configs: List[Tuple[int, int, int]], rate: Optional[float], repeat: int = 3, progress=None) -> Dict:
    """Times one encode on this core for each (n, k, block) and, when the drive model has
    a CPU budget (``rate``), one budgeted encode of the first configuration; fits the
    host's :class:`EncodeCost`."""
    samples, rows = [], []
    for n, k, b in configs:
        wall, cpu = time_encode(n, k, b, repeat)
        samples.append((n, k, b, wall))
        rows.append({"n": n, "k": k, "block_bytes": b, "host_s": wall, "host_cpu_s": cpu})
        if progress:
            progress(f"  EC ({n},{k}) x {b >> 10} KiB on one host core: {wall * 1e3:.2f} ms")
    cost = fit_cost(samples)
    out = {"library": "ISA-L ec_encode_data (Cauchy matrix), column slices of about 32 Mi multiply-accumulates", "samples": rows, "host_cost": cost.as_dict()}
    if rate:
        n, k, b = configs[0]
        enc = Encoder(n, k, b)
        enc.encode()
        # Long enough that sleep granularity does not count.
        loops = max(1, int(0.5 / max(rows[0]["host_s"] / rate, 1e-6)))
        best = float("inf")
        for _ in range(max(1, repeat)):
            t = time.monotonic()
            enc.encode(rate, loops)
            best = min(best, (time.monotonic() - t) / loops)
        out["device_sample"] = {"n": n, "k": k, "block_bytes": b, "device_s": best, "rate": rate}
        # Device wall time per host wall second: the budget's own slowdown as measured here.
        out["device_to_host_ratio"] = best / rows[0]["host_s"]
    return out


def _series_main(argv: Sequence[str]) -> int:
    """``series N K BLOCK ROUNDS RATE MAX_DRIVES REPEAT``: the measured series as JSON."""
    n, k, block, rounds = (int(x) for x in argv[:4])
    rate, max_drives, repeat = float(argv[4]), int(argv[5]), int(argv[6])
    pts = measure_series(n, k, block, rounds, rate, max_drives, repeat, progress=lambda s: print(s, file=sys.stderr, flush=True))
    cfg = {"n": n, "k": k, "block_bytes": block, "rounds": rounds, "rate": rate, "repeat": repeat, "chunk_bytes": slice_bytes(n, k, block)}
    print(json.dumps({"config": cfg, "points": pts}, indent=2))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        sys.exit(_worker(sys.argv[2:]))
    if sys.argv[1:2] == ["series"] and len(sys.argv) == 9:
        sys.exit(_series_main(sys.argv[2:]))
    sys.exit(
        "usage: python -m insitu.plan.ecbench series N K BLOCK ROUNDS RATE MAX_DRIVES REPEAT\n"
        "       python -m insitu.plan.ecbench worker N K BLOCK ROUNDS CHUNK RATE|none"
    )
