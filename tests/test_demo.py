# SPDX-License-Identifier: Apache-2.0
"""`insitu demo`: every function offloaded and on the host over a generated data set; all
results agree, and checksums, grep and wc move at most 1% of the conventional bytes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import INSITU, cli_json

SMALL_RESULT = ("crc32c", "xxh3", "sha256", "blake3", "grep", "wc")


def test_demo_json(workdir):
    p = subprocess.Popen([INSITU, "demo", "--json", "--size", "256M"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    doc = json.loads(out)
    assert doc["all_agree"] is True
    assert doc["image"]["size"] == 256 << 20 and doc["image"]["fs"] == "ext4"
    rows = doc["rows"]
    assert rows
    covered = set()
    for r in rows:
        fn = r["function"]
        covered.add(fn.split()[0])
        assert r["agree"] is True, f"{fn}: {r.get('disagreement')}"
        assert r["within_1pct"] is True, fn
        off, conv = r["offload"], r["conventional"]
        assert off["commands"] >= 1 and conv["commands"] == 0, fn
        assert off["media_bytes"] > 0 and conv["bytes_to_host"] > 0, fn
        # Recompute what the demo claims from its own stats.
        ratio = off["bytes_to_host"] / max(conv["bytes_to_host"], 1)
        assert abs(ratio - r["bytes_to_host_ratio"]) <= 1e-9 * max(1.0, ratio), fn
        if fn.split()[0] in SMALL_RESULT:
            assert off["bytes_to_host"] <= conv["bytes_to_host"] / 100, fn
    assert covered == {f["name"] for f in cli_json("functions")}, "the demo should run every function"
    # The demo cleans up after itself: no image left mounted or on disk.
    scratch = Path(f"/var/tmp/insitu-demo-{p.pid}")
    assert not scratch.exists()
    with open("/proc/self/mounts") as f:
        assert str(scratch) not in f.read()
