# SPDX-License-Identifier: Apache-2.0
"""``insitu plan ec``: CSDPLAN-EC's break-even number of computational drives for (n, k)
Reed-Solomon encodes, and its sweeps.

Inputs, in order of precedence:

* ``--drive csdplan-ec`` (the default without a calibration): the paper's own host core
  and Newport CSD (:data:`~insitu.plan.inputs.EC_PROFILES`);
* ``--drive PRESET`` (a preset of ``insitu model list``): the host is one EPYC 7352 core as
  in the paper, or this machine's core from ``--calibration``; the drive encodes at the
  preset's CPU budget (``workers x cpu_share`` host cores) or, when the calibration was
  measured with this preset, at the device/host ratio measured under that budget;
* ``--device-compute X`` / ``--host-compute X`` make either side X times as fast.

The encoded blocks are ``n + k`` with ``n = 2k`` (the paper's codes: 12 blocks = (8, 4));
``--parity K`` sets k for other codes.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from ._errors import PlanError
from .csdplan import EcBreakEvenModel, EncodeCost
from .inputs import EC_PROFILES, drive as drive_preset

__all__ = ["code", "plan", "sweep", "predict_here", "SWEEPS", "DEFAULT_VALUES"]

SWEEPS = ("blocks", "block-size", "device-compute")
#: Sweep values when --values is not given: the x-axes of CSDPLAN-EC's Figs. 5-7.
DEFAULT_VALUES = {
    "blocks": [12, 18, 24, 30, 36, 42, 48],
    "block-size": [16 << 20, 32 << 20, 64 << 20, 128 << 20],
    "device-compute": [1, 2, 3, 4, 5],
}


def code(blocks: int, parity: Optional[int] = None) -> Tuple[int, int]:
    """(n, k) for ``blocks`` encoded blocks: n = 2k unless ``parity`` gives k."""
    if parity is not None:
        if not 1 <= parity < blocks:
            raise PlanError(f"--parity {parity} must be at least 1 and less than --blocks {blocks}")
        return blocks - parity, parity
    if blocks < 3 or blocks % 3:
        raise PlanError(
            f"--blocks {blocks}: with n = 2k the encoded blocks n + k are a multiple of 3 (12 = (8, 4), 48 = (32, 16)); give --parity K for other codes"
        )
    return 2 * blocks // 3, blocks // 3


def _encoders(drive: str, calibration: Optional[dict]) -> Tuple[EncodeCost, EncodeCost, str, str]:
    """(host cost, CSD cost, the preset timing transfers, where the numbers come from)."""
    if drive in EC_PROFILES:
        if calibration is not None:
            raise PlanError(f"--drive {drive} is the paper's own measurements; with --calibration, name a drive preset (e.g. --drive newport)")
        p = EC_PROFILES[drive]
        return p.host, p.csd, p.drive_preset, f"profile {drive}: {p.description}"
    d = drive_preset(drive)
    rate = d.compute_rate or 1.0
    if calibration is not None:
        ec = calibration.get("ec")
        if not ec:
            raise PlanError("the calibration has no erasure-coding measurements; run `insitu plan calibrate` where ISA-L is installed (without --skip-ec)")
        host = EncodeCost(**ec["host_cost"])
        same = calibration.get("drive", {}).get("name") == d.name and ec.get("device_to_host_ratio")
        if same:
            ratio = ec["device_to_host_ratio"]
            src = f"host: ISA-L on this machine's core (calibration); {d.name}: {ratio:.2f}x the host, measured under its CPU budget"
        else:
            ratio = 1.0 / rate
            src = f"host: ISA-L on this machine's core (calibration); {d.name}: its CPU budget, {rate:g} host cores"
    else:
        host = EC_PROFILES["csdplan-ec"].host
        ratio = 1.0 / rate
        src = f"host: one EPYC 7352 core (CSDPLAN-EC Fig. 6a); {d.name}: its CPU budget, {rate:g} host cores"
    return host, host.scaled(1.0 / ratio), d.name, src


def plan(
    blocks: int,
    block_bytes: int,
    device_compute: float = 1.0,
    host_compute: float = 1.0,
    drive: str = "csdplan-ec",
    parity: Optional[int] = None,
    transfer: bool = False,
    calibration: Optional[dict] = None,
    max_drives: int = 8,
) -> dict:
    """The break-even point and the two systems' times for 1..max(max_drives, BEP) drives."""
    n, k = code(blocks, parity)
    host_cost, csd_cost, preset, source = _encoders(drive, calibration)
    host_cost, csd_cost = host_cost.scaled(host_compute), csd_cost.scaled(device_compute)
    host_tx = csd_tx = 0.0
    if transfer:
        d = drive_preset(preset)
        data = n * block_bytes
        host_tx = data / (d.host_read_mb_s * 1e6) if d.host_read_mb_s else 0.0
        csd_tx = data / (d.internal_read_mb_s * 1e6) if d.internal_read_mb_s else 0.0
    m = EcBreakEvenModel(host_cost.seconds(n, k, block_bytes), csd_cost.seconds(n, k, block_bytes), host_tx, csd_tx)
    be = m.break_even()
    last = max(max_drives, be or 0)
    return {
        "break_even": be,
        "blocks": n + k,
        "n": n,
        "k": k,
        "block_bytes": block_bytes,
        "device_compute": device_compute,
        "host_compute": host_compute,
        "drive": drive,
        "source": source,
        "host_encode_s": m.host_encode_s,
        "csd_encode_s": m.csd_encode_s,
        "csd_to_host_ratio": m.csd_encode_s / m.host_encode_s if m.host_encode_s > 0 else None,
        "transfer": transfer,
        "host_transfer_s": host_tx,
        "csd_transfer_s": csd_tx,
        "model": "T_SSD(M) = T_tx_host + M * T_host_ec; T_CSD(M) = T_tx_csd + T_csd_ec; break_even = least M with T_CSD(M) < T_SSD(M)",
        "series": [{"drives": i, "host_s": m.host_s(i), "csd_s": m.csd_s(i)} for i in range(1, last + 1)],
    }


def sweep(param: str, values: List[float], **fixed) -> dict:
    """:func:`plan` over one parameter's values; ``{"sweep": param, "points": [...]}``."""
    if param not in SWEEPS:
        raise PlanError(f"--sweep {param}: choose from {', '.join(SWEEPS)}")
    key = {"blocks": "blocks", "block-size": "block_bytes", "device-compute": "device_compute"}[param]
    pts = []
    for v in values:
        args = dict(fixed)
        args[key] = int(v) if key != "device_compute" else float(v)
        r = plan(**args)
        pts.append(
            {param: args[key], "break_even": r["break_even"], "n": r["n"], "k": r["k"], "host_encode_s": r["host_encode_s"], "csd_encode_s": r["csd_encode_s"]}
        )
    base = plan(**fixed)
    inputs = {k: base[k] for k in ("blocks", "n", "k", "block_bytes", "device_compute", "host_compute", "drive", "source", "transfer")}
    return {"sweep": param, "inputs": inputs, "points": pts}


def predict_here(calibration: dict, n: int, k: int, block_bytes: int, rounds: int, max_drives: int) -> dict:
    """The measured series of :func:`insitu.plan.ecbench.measure_series` as the model
    predicts it from a calibration: the host encodes M jobs of ``rounds`` passes in turn;
    each drive one job at the measured device/host ratio, but the emulated drives together
    cannot use more than this machine's cores."""
    ec = calibration.get("ec") or {}
    if not ec.get("host_cost"):
        raise PlanError("the calibration has no erasure-coding measurements")
    host = EncodeCost(**ec["host_cost"]).seconds(n, k, block_bytes) * rounds
    ratio = ec.get("device_to_host_ratio") or 1.0 / (ec.get("drive_rate") or 1.0)
    cores = (calibration.get("machine") or {}).get("cpus")
    pts = []
    for m in range(1, max_drives + 1):
        csd = host * ratio
        bound = m * host / cores if cores else 0.0
        pts.append({"drives": m, "host_s": m * host, "csd_s": max(csd, bound), "machine_limited": bound > csd})
    be = next((p["drives"] for p in pts if p["csd_s"] < p["host_s"]), None)
    return {"break_even": be, "host_encode_s": host / rounds, "csd_to_host_ratio": ratio, "points": pts}
