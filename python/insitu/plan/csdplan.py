# SPDX-License-Identifier: Apache-2.0
"""CSDPLAN's analytic model and its erasure-coding extension, CSDPLAN-EC.

**CSDPLAN** (Byun et al.) compares a kernel over ``D`` bytes spread evenly over ``M``
drives on two systems:

* a host with an SSD array pulls the data and computes on one core:
  ``T_host(M) = max(T_tx / M, T_link) + T_host_comp``, where ``T_tx`` moves ``D`` from one
  drive and ``T_link = D / link rate`` is the shared bus that stops the transfer from
  shrinking beyond ``M_bottleneck = T_tx / T_link`` drives;
* an array of computational drives (CSDs) reads and computes every share in place:
  ``T_csd(M) = T_csd(1) / M``.

The break-even point (BEP) is the smallest ``M`` with ``T_csd(M) < T_host(M)`` (a tie is no
win). :class:`BreakEvenModel` is the same model, with the same search, as the Rust
benchmark's (``insitu bench break-even``), so both give the same BEP for the same inputs.

**CSDPLAN-EC** runs ``M`` (n, k) Reed-Solomon encodes on ``M`` devices. The host encodes
them one after another on one core; every CSD encodes its own in parallel. Block transfer
overlaps the encoding and is paid once, so (as the paper does) it may be left out:
``T_host(M) = T_tx_host + M * T_host_ec`` and ``T_csd(M) = T_tx_csd + T_csd_ec``, hence
``BEP = floor((T_csd_ec + T_tx_csd - T_tx_host) / T_host_ec) + 1``. :class:`EncodeCost`
gives one encode's time from (n, k, block size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

__all__ = ["MAX_DRIVES", "BreakEvenModel", "EcBreakEvenModel", "EncodeCost"]

#: Largest array the break-even search considers (as the Rust model).
MAX_DRIVES = 1_000_000


@dataclass(frozen=True)
class BreakEvenModel:
    """CSDPLAN's model of one kernel, in seconds for the whole data set."""

    #: Moving all the data from one drive to the host (``D / one drive's host read rate``).
    transfer_one_s: float
    #: Moving all the data over the shared link (``D / link rate``); 0 for no link limit.
    transfer_link_s: float
    #: The kernel on one host core, data in memory.
    host_compute_s: float
    #: The kernel on one CSD over all the data (its internal reads and its compute).
    csd_one_s: float

    def host_s(self, m: int) -> float:
        """``T_host(M)``: transfer (shrinking with M until the link binds) plus compute."""
        return max(self.transfer_one_s / max(m, 1), self.transfer_link_s) + self.host_compute_s

    def csd_s(self, m: int) -> float:
        """``T_csd(M) = T_csd(1) / M``."""
        return self.csd_one_s / max(m, 1)

    def link_bound_from(self) -> float:
        """Drives beyond which the link, not the drives, limits the host's transfer."""
        return self.transfer_one_s / self.transfer_link_s if self.transfer_link_s > 0 else math.inf

    def break_even(self, max_drives: int = MAX_DRIVES) -> Optional[int]:
        """The smallest number of drives at which the CSD array is faster, or ``None`` if it
        never is up to ``max_drives``."""

        # T_host - T_csd only grows with M once the CSD loses at M = 1, so the first winning
        # M is found by bisection, exactly as the Rust model does it.
        def wins(m: int) -> bool:
            return self.csd_s(m) < self.host_s(m)

        if wins(1):
            return 1
        if not wins(max_drives):
            return None
        lo, hi = 1, max_drives
        while hi - lo > 1:
            mid = lo + (hi - lo) // 2
            if wins(mid):
                hi = mid
            else:
                lo = mid
        return hi


@dataclass(frozen=True)
class EncodeCost:
    """Seconds for one (n, k) Reed-Solomon encode of ``n`` data blocks of ``B`` bytes into
    ``k`` parity blocks: ``fixed_s + per_byte_s * (n + k) * B + per_mac_s * n * k * B``.

    The ``(n + k) * B`` term is the streaming of data in and parity out; ``n * k * B`` is
    the Galois-field multiply-accumulates, one per data byte per parity block."""

    fixed_s: float
    per_byte_s: float
    per_mac_s: float

    def seconds(self, n: int, k: int, block_bytes: int) -> float:
        """One encode's time."""
        return self.fixed_s + self.per_byte_s * (n + k) * block_bytes + self.per_mac_s * n * k * block_bytes

    def scaled(self, speed: float) -> "EncodeCost":
        """The same encoder on a processor ``speed`` times as fast (the whole time shrinks,
        as CSDPLAN-EC's Fig. 7 scales computational power)."""
        return EncodeCost(self.fixed_s / speed, self.per_byte_s / speed, self.per_mac_s / speed)

    def as_dict(self) -> dict:
        return {"fixed_s": self.fixed_s, "per_byte_s": self.per_byte_s, "per_mac_s": self.per_mac_s}


@dataclass(frozen=True)
class EcBreakEvenModel:
    """CSDPLAN-EC: ``M`` encodes on the host (one after another) vs on ``M`` CSDs."""

    #: One encode on one host core.
    host_encode_s: float
    #: One encode on one CSD.
    csd_encode_s: float
    #: The first block set's transfer to the host (0: left out, as in the paper).
    host_transfer_s: float = 0.0
    #: The first block set's read inside a CSD (0: left out).
    csd_transfer_s: float = 0.0

    def host_s(self, m: int) -> float:
        """``T_SSD(M) = T_tx + M * T_host_ec``."""
        return self.host_transfer_s + max(m, 1) * self.host_encode_s

    def csd_s(self, m: int) -> float:
        """``T_CSD(M) = T_tx + T_csd_ec``: every device encodes its own set at once."""
        return self.csd_transfer_s + self.csd_encode_s

    def break_even(self, max_drives: int = MAX_DRIVES) -> Optional[int]:
        """The smallest M with ``T_CSD(M) < T_SSD(M)``, or ``None`` if none up to
        ``max_drives`` (a host that takes no time per encode is never beaten)."""
        if self.csd_s(1) < self.host_s(1):
            return 1
        if self.host_encode_s <= 0:
            return None
        # Closed form, then nudged so floating-point rounding cannot shift it by one.
        m = max(1, math.floor((self.csd_s(1) - self.host_transfer_s) / self.host_encode_s) + 1)
        while m > 1 and self.csd_s(m - 1) < self.host_s(m - 1):
            m -= 1
        while not self.csd_s(m) < self.host_s(m):
            m += 1
        return m if m <= max_drives else None
