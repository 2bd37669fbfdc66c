# SPDX-License-Identifier: Apache-2.0
"""Break-even for plain kernels (``insitu plan scan``): CSDPLAN with inputs from flags or
from a calibration of this machine.

From flags, the terms are the specification's: ``T_tx = D / drive host read``,
``T_link = D / link``, ``T_host_comp = D / host rate`` and
``T_csd(1) = max(D / drive internal read, T_host_comp x device slowdown)`` (a drive reads
and computes in a pipeline).

From a calibration (``insitu plan calibrate``), every term is what ``insitu bench
break-even`` measured at a few data sizes: compute terms interpolated linearly between
them (caches make their rate change with size) and at the nearest one's rate outside them;
transfers on a least-squares line through all of them. Two predictions are made:

* ``csdplan``: CSDPLAN's formula with the calibrated terms at the full size, the same as
  the Rust benchmark's ``break_even_model``;
* ``here``: the same scaling rules applied share by share, as the benchmark runs them on
  this machine: each of N drives holds ``D / N``, so the host's compute and the drives'
  time are taken at the share size (caches make small shares faster per byte); the host's
  pull cannot beat the shared path's rate (the link, or what two drives with shares of
  that size reached together in calibration when that was less than twice one drive);
  likewise the emulated drives cannot compute faster together than two of them did with
  shares of that size, when those two slowed each other; and they cannot use more CPU (each its kernel's, and a copy of its
  share at this machine's memory copy rate) than the cores this machine had free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from ._errors import PlanError
from .csdplan import BreakEvenModel

__all__ = ["KERNELS", "DEFAULT_SIZE", "Curve", "Line", "KernelCalibration", "spec_model", "predict_here", "series", "calibrations"]

#: The kernels of CSDPLAN's evaluation, as ``insitu bench break-even`` runs them.
KERNELS = ["count", "vector-add", "array-merge", "pagerank"]
#: The benchmark's default data size per kernel (PageRank: its edge data).
DEFAULT_SIZE = {"count": 256 << 20, "vector-add": 256 << 20, "array-merge": 256 << 20, "pagerank": 32 << 20}
#: Two drives reaching less than this share of twice one drive's rate were held back by
#: the shared path.
_SHARED_PATH_SHARE = 0.9


@dataclass(frozen=True)
class Curve:
    """Seconds as a function of data size through measured (size, seconds) points:
    linear between them; outside them, at the rate of the nearest one (time in proportion
    to size, as once caches stop mattering); never below a microsecond."""

    points: tuple

    def __call__(self, size: float) -> float:
        pts = self.points
        if size <= pts[0][0] or size >= pts[-1][0]:
            s0, t0 = pts[0] if size <= pts[0][0] else pts[-1]
            return max(t0 * size / s0, 1e-6)
        i = 0
        while size > pts[i + 1][0]:
            i += 1
        (s0, t0), (s1, t1) = pts[i], pts[i + 1]
        return max(t0 + (t1 - t0) * (size - s0) / (s1 - s0), 1e-6)


@dataclass(frozen=True)
class Line:
    """Seconds as a straight line in data size, ``a + b x size``, fitted by least squares
    through measured (size, seconds) points (through the origin when the fitted ``a`` would
    be negative, and for one point). For transfers: they grow linearly, and a fit through
    several sizes smooths the noise of short measurements."""

    a: float
    b: float

    @classmethod
    def fit(cls, points: tuple) -> "Line":
        n = len(points)
        if n >= 2:
            sx = sum(s for s, _ in points) / n
            sy = sum(t for _, t in points) / n
            var = sum((s - sx) ** 2 for s, _ in points)
            if var > 0:
                b = sum((s - sx) * (t - sy) for s, t in points) / var
                a = sy - b * sx
                if a >= 0 and b > 0:
                    return cls(a, b)
        return cls(0.0, sum(s * t for s, t in points) / sum(s * s for s, _ in points))

    def __call__(self, size: float) -> float:
        return max(self.a + self.b * size, 1e-6)


@dataclass(frozen=True)
class KernelCalibration:
    """One kernel's measured terms, each a :class:`Curve` over the data size."""

    kernel: str
    sizes: tuple
    host_compute: Curve
    device_cpu: Curve
    csd_one: Curve
    pull_one: Line
    pull_two: Optional[Line]

    @classmethod
    def from_samples(cls, kernel: str, samples: List[dict]) -> "KernelCalibration":
        if not samples:
            raise PlanError(f"the calibration has no samples for {kernel}; run `insitu plan calibrate` again")
        samples = sorted(samples, key=lambda s: s["data_bytes"])
        if len({s["data_bytes"] for s in samples}) != len(samples):
            raise PlanError(f"the calibration measures {kernel} twice at one size")

        def curve(key: str) -> Curve:
            try:
                return Curve(tuple((float(s["data_bytes"]), float(s[key])) for s in samples))
            except (KeyError, TypeError, ValueError):
                raise PlanError(f"the calibration's {kernel} samples lack {key!r}; run `insitu plan calibrate` again") from None

        two = [s for s in samples if s.get("pull_two_s") is not None]
        return cls(
            kernel=kernel,
            sizes=tuple(s["data_bytes"] for s in samples),
            host_compute=_host_compute(samples) or curve("host_compute_s"),
            device_cpu=curve("device_compute_cpu_s"),
            csd_one=curve("csd_one_s"),
            pull_one=Line.fit(curve("pull_one_s").points),
            pull_two=Line.fit(tuple((float(s["data_bytes"]), float(s["pull_two_s"])) for s in two)) if two else None,
        )

    def csdplan(self, data: int, link_mb_s: Optional[float]) -> BreakEvenModel:
        """CSDPLAN's terms at the full size (as the benchmark's ``break_even_model``)."""
        return BreakEvenModel(
            transfer_one_s=self.pull_one(data),
            transfer_link_s=data / (link_mb_s * 1e6) if link_mb_s else 0.0,
            host_compute_s=self.host_compute(data),
            csd_one_s=self.csd_one(data),
        )

    def shared_path_s(self, data: int, link_mb_s: Optional[float], drives: int = 2) -> float:
        """Seconds the shared path needs to bring ``data`` from ``drives`` drives: the link,
        or, when two drives with shares of this size did not reach (nearly) twice one
        drive's rate, the rate those two reached together."""
        link = data / (link_mb_s * 1e6) if link_mb_s else 0.0
        if self.pull_two is None:
            return link
        share = data / drives
        two, one = self.pull_two(2 * share), self.pull_one(share)
        held_back = one < _SHARED_PATH_SHARE * two
        return max(link, two * data / (2 * share)) if held_back else link


def _host_compute(samples: List[dict]) -> Optional[Curve]:
    """The host's compute per share as the benchmark's host pass meets it, right after
    pulling the share: one drive's share is the whole size, two drives' shares are half of
    it each (so every size gives two points; points at one size are averaged). None when
    the calibration predates these measurements."""
    if not all(s.get("host_compute_pulled_s") and s.get("host_compute_two_s") for s in samples):
        return None
    by_size: Dict[float, List[float]] = {}
    for s in samples:
        size = float(s["data_bytes"])
        by_size.setdefault(size, []).append(float(s["host_compute_pulled_s"]))
        by_size.setdefault(size / 2, []).append(float(s["host_compute_two_s"]) / 2)
    return Curve(tuple((size, sum(v) / len(v)) for size, v in sorted(by_size.items())))


def spec_model(
    data: int, host_mb_s: float, slowdown: float, drive_host_mb_s: Optional[float], drive_internal_mb_s: Optional[float], link_mb_s: Optional[float]
) -> BreakEvenModel:
    """CSDPLAN from specifications: rates in MB/s (10^6 bytes/s); a read rate of None is
    not modelled (takes no time)."""
    host = data / (host_mb_s * 1e6)
    return BreakEvenModel(
        transfer_one_s=data / (drive_host_mb_s * 1e6) if drive_host_mb_s else 0.0,
        transfer_link_s=data / (link_mb_s * 1e6) if link_mb_s else 0.0,
        host_compute_s=host,
        csd_one_s=max(data / (drive_internal_mb_s * 1e6) if drive_internal_mb_s else 0.0, host * slowdown),
    )


def series(model: BreakEvenModel, max_drives: int) -> List[dict]:
    """``T_host`` and ``T_csd`` for 1..max_drives drives."""
    return [{"drives": m, "host_s": model.host_s(m), "csd_s": model.csd_s(m), "csd_faster": model.csd_s(m) < model.host_s(m)} for m in range(1, max_drives + 1)]


def predict_here(
    cal: KernelCalibration,
    data: int,
    link_mb_s: Optional[float],
    cores: Optional[float],
    max_drives: int,
    search_to: int = 256,
    copy_gb_s: Optional[float] = None,
) -> dict:
    """The series on this machine, share by share (see the module docs), and the first N
    at which the drives win (searched up to ``search_to``)."""

    def point(m: int) -> dict:
        share = data / m
        link = data / (link_mb_s * 1e6) if link_mb_s else 0.0
        pull = max(cal.pull_one(share), cal.shared_path_s(data, link_mb_s, m) if m > 1 else link)
        compute = m * cal.host_compute(share)
        csd = cal.csd_one(share)
        # A drive's CPU: its kernel under the budget, and copying its share off the media.
        cpu = cal.device_cpu(share) + (share / (copy_gb_s * 1e9) if copy_gb_s else 0.0)
        cpu_bound = m * cpu / cores if cores else 0.0
        return {
            "drives": m,
            "host_s": pull + compute,
            "host_pull_s": pull,
            "host_compute_s": compute,
            "csd_s": max(csd, cpu_bound),
            "machine_limited": cpu_bound > csd,
        }

    def wins(p: dict) -> bool:
        return p["csd_s"] < p["host_s"]

    pts = [point(m) for m in range(1, max_drives + 1)]
    be = next((p["drives"] for p in pts if wins(p)), None)
    if be is None:
        be = next((m for m in range(max_drives + 1, search_to + 1) if wins(point(m))), None)
    return {"break_even": be, "points": pts}


def calibrations(doc: dict) -> Dict[str, KernelCalibration]:
    """Every kernel of a calibration document."""
    ks = doc.get("kernels")
    if not isinstance(ks, dict) or not ks:
        raise PlanError("the calibration has no kernel measurements; run `insitu plan calibrate` (without --skip-kernels)")
    return {name: KernelCalibration.from_samples(name, v.get("samples", [])) for name, v in ks.items()}
