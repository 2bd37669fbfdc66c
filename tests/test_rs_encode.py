# SPDX-License-Identifier: Apache-2.0
"""The rs-encode kernel computes the parity Swift's isa_l_rs_vand policy stores: for every
stripe of k fragments, offloaded and on the host, its m parity fragments equal the payloads
of PyECLib's parity fragments for the same segment."""

from __future__ import annotations

import os
import sys

import pytest

from helpers import exec_json

SYSTEM_SITE = "/usr/lib/python3/dist-packages"


def pyeclib_driver(k: int, m: int):
    if SYSTEM_SITE not in sys.path:
        sys.path.append(SYSTEM_SITE)
    try:
        from pyeclib.ec_iface import ECDriver
    except ImportError:
        pytest.skip("Debian's python3-pyeclib is not installed (make deps installs it)")
    return ECDriver(k=k, m=m, ec_type="isa_l_rs_vand")


@pytest.mark.parametrize("k,m,unit", [(4, 2, 4096), (3, 2, 1024), (6, 3, 512)])
def test_parity_equals_swifts_isa_l_rs_vand(ext4_fs, k, m, unit):
    driver = pyeclib_driver(k, m)
    stripe = k * unit
    data = os.urandom(3 * stripe + stripe // 3)  # three stripes and a short last one
    d = ext4_fs.mkdir(f"rs-{k}-{m}-{unit}")
    src = d / "data.bin"
    src.write_bytes(data)
    for conventional in (False, True):
        dest = d / f"data.{conventional}.parity"
        doc = exec_json("rs-encode", [src], {"k": k, "m": m, "unit": unit}, output=dest, conventional=conventional, force=True)
        r = doc["results"][0]
        assert r["stripes"] == 4 and r["output_length"] == 4 * m * unit
        parity = dest.read_bytes()
        for s in range(4):
            segment = data[s * stripe : (s + 1) * stripe].ljust(stripe, b"\0")
            frags = driver.encode(segment)
            assert len(frags) == k + m
            for p in range(m):
                want = frags[k + p][80:]
                assert len(want) == unit, "PyECLib cut the segment into fragments of another size"
                got = parity[(s * m + p) * unit : (s * m + p + 1) * unit]
                assert got == want, f"stripe {s}, parity {p} ({'host' if conventional else 'offloaded'})"
