# SPDX-License-Identifier: Apache-2.0
"""Where the planner's inputs come from: sizes and numbers on the command line, the shared
links, the drive presets of ``insitu model`` and the profiles taken from the papers.

Drive presets are not copied here: :func:`drive` asks ``insitu model show NAME --json``
(the Rust presets in ``crates/model/src/preset.rs``), so the planner and the emulated drives
of ``insitu bench`` use the same numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Optional, Tuple

from .._units import parse_size
from ._errors import PlanError
from .csdplan import EncodeCost

__all__ = [
    "MIB",
    "Drive",
    "drive",
    "link_mb_s",
    "LINK_NAMES",
    "size",
    "number",
    "positive_int",
    "number_list",
    "size_list",
    "EC_PROFILES",
    "EcProfile",
    "PAPER_EC_POINTS",
]

MIB = 1 << 20

# ---------------------------------------------------------------------------------------
# Numbers and sizes as users write them.


def size(text: str, what: str = "size") -> int:
    """Bytes in ``text`` (``4M``, ``1.5G``, ``65536``); a :class:`PlanError` naming
    ``what`` when it is not a positive size."""
    try:
        v = parse_size(text)
    except (ValueError, IndexError):
        raise PlanError(f"{what}: {text!r} is not a size; write bytes or a number with K, M, G or T (e.g. 64M)") from None
    if v <= 0:
        raise PlanError(f"{what}: {text!r} must be more than 0 bytes")
    return v


def number(text: str, what: str, minimum: float = 0.0, inclusive: bool = False) -> float:
    """A float above ``minimum`` (or at least it, with ``inclusive``)."""
    try:
        v = float(text)
    except ValueError:
        raise PlanError(f"{what}: {text!r} is not a number") from None
    if v != v or v in (float("inf"), float("-inf")) or (v < minimum if inclusive else v <= minimum):
        raise PlanError(f"{what}: {text} must be {'at least' if inclusive else 'more than'} {minimum:g}")
    return v


def positive_int(text: str, what: str) -> int:
    """A whole number of at least 1."""
    try:
        v = int(text)
    except ValueError:
        raise PlanError(f"{what}: {text!r} is not a whole number") from None
    if v < 1:
        raise PlanError(f"{what}: {v} must be 1 or more")
    return v


def number_list(text: str, what: str) -> List[float]:
    """Comma-separated positive numbers."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise PlanError(f"{what}: give at least one value, comma-separated (e.g. 1,2,5)")
    return [number(p.strip(), what) for p in parts]


def size_list(text: str, what: str) -> List[int]:
    """Comma-separated sizes."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise PlanError(f"{what}: give at least one size, comma-separated (e.g. 16M,64M)")
    return [size(p.strip(), what) for p in parts]


# ---------------------------------------------------------------------------------------
# Links: the same formulas as `LinkConfig` in crates/model/src/link.rs.

#: TCP payload per Ethernet frame at a 1500-byte MTU (as `ETHERNET_TCP_EFFICIENCY`).
_ETHERNET_TCP_EFFICIENCY = 1460.0 / 1538.0


def _pcie(gen: int, lanes: int) -> float:
    gt_s = {4: 16.0, 5: 32.0}.get(gen, 8.0)
    return lanes * gt_s * 1000.0 * 128.0 / 130.0 / 8.0


def _ethernet(gbit_s: float) -> float:
    return gbit_s * 1000.0 / 8.0 * _ETHERNET_TCP_EFFICIENCY


_LINKS: Dict[str, float] = {
    "pcie-gen3-x4": _pcie(3, 4),
    "pcie-gen4-x4": _pcie(4, 4),
    "10gbe": _ethernet(10.0),
    "25gbe": _ethernet(25.0),
    "40gbe": _ethernet(40.0),
    "100gbe": _ethernet(100.0),
}
LINK_NAMES = list(_LINKS)


def link_mb_s(spec: str) -> Optional[float]:
    """The payload rate (MB/s) of a named link, a number of MB/s, or ``None`` for ``none``
    (no shared-link limit)."""
    s = spec.strip().lower()
    if s == "none":
        return None
    if s in _LINKS:
        return _LINKS[s]
    try:
        v = float(s)
    except ValueError:
        raise PlanError(f"--link: unknown link {spec!r}; use one of {', '.join(LINK_NAMES)}, a rate in MB/s, or none") from None
    if not v > 0:
        raise PlanError(f"--link: {spec} MB/s must be more than 0")
    return v


# ---------------------------------------------------------------------------------------
# Drive presets, from `insitu model show NAME --json`.


@dataclass(frozen=True)
class Drive:
    """What the planner needs of a drive model."""

    name: str
    description: str
    #: Sequential read as the host sees it, MB/s (None: not modelled).
    host_read_mb_s: Optional[float]
    #: Sequential read as the drive's engine sees it, MB/s (None: not modelled).
    internal_read_mb_s: Optional[float]
    #: Host-core equivalents of the engine (workers x cpu_share); None: host speed.
    compute_rate: Optional[float]

    @classmethod
    def from_json(cls, m: dict) -> "Drive":
        der = m.get("derived") or {}
        c = m.get("compute")
        return cls(
            name=m.get("name", "?"),
            description=m.get("description", ""),
            host_read_mb_s=der.get("host_read_mb_s"),
            internal_read_mb_s=der.get("internal_read_mb_s"),
            compute_rate=c["workers"] * c["cpu_share"] if c else None,
        )

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "host_read_mb_s": self.host_read_mb_s,
            "internal_read_mb_s": self.internal_read_mb_s,
            "compute_rate": self.compute_rate,
        }


@lru_cache(maxsize=None)
def _model_show(name: str) -> Tuple[int, str, str]:
    p = subprocess.run([sys.executable, "-m", "insitu", "model", "show", name, "--json"], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def drive(name: str) -> Drive:
    """The drive preset ``name`` (or ``PRESET@MB_S``, ``custom:MB_S``), as ``insitu model
    show`` prints it."""
    rc, out, err = _model_show(name)
    if rc != 0 or not out.strip():
        msg = err.strip().splitlines()[-1] if err.strip() else f"exit code {rc}"
        raise PlanError(f"--drive {name}: {msg} (see `insitu model list`)")
    try:
        return Drive.from_json(json.loads(out))
    except (ValueError, KeyError, TypeError) as e:
        raise PlanError(f"--drive {name}: cannot read `insitu model show` output: {e}") from None


# ---------------------------------------------------------------------------------------
# Erasure-coding profiles from CSDPLAN-EC.

#: The execution times CSDPLAN-EC reports for one (n, k) RS encode with n = 2k, read off
#: its text: (encoded blocks n + k, block MiB, SSD(1) s, CSD-N s, where).
PAPER_EC_POINTS: List[Tuple[int, int, float, float, str]] = [
    (12, 64, 3.0, 3.8, "Fig. 6a"),
    (48, 64, 4.8, 22.3, "Fig. 6a"),
    (24, 16, 3.0, 4.0, "Fig. 5a"),
    (24, 128, 4.0, 10.0, "Fig. 5a"),
]


@dataclass(frozen=True)
class EcProfile:
    """A host core and a CSD as erasure-code encoders."""

    name: str
    description: str
    host: EncodeCost
    csd: EncodeCost
    #: The drive preset whose read rates time the first block transfer (with --transfer).
    drive_preset: str


EC_PROFILES: Dict[str, EcProfile] = {
    "csdplan-ec": EcProfile(
        name="csdplan-ec",
        description=(
            "CSDPLAN-EC's measured systems: one EPYC 7352 core (SSD(1)) against a Newport CSD "
            "(CSD-N, 4 x Cortex-A53, multithreaded), both running ISA-L. Host: the line through "
            "Fig. 6a's SSD(1) times (3.0 s at 12 and 4.8 s at 48 blocks of 64 MiB). CSD: a line in "
            "n*k*B chosen inside the band that Figs. 5b, 6b and 7a's break-even points allow "
            "(no one line passes through all of CSD-N's read-off times)."
        ),
        host=EncodeCost(fixed_s=2.88, per_byte_s=0.0, per_mac_s=(1.8 / 30720.0) / MIB),
        csd=EncodeCost(fixed_s=2.6, per_byte_s=0.0, per_mac_s=5.2e-4 / MIB),
        drive_preset="newport",
    ),
}
