# SPDX-License-Identifier: Apache-2.0
"""Builds or re-ports the rings of a single-node cluster, with Swift's own RingBuilder.

Run by the system Python (the one that has Swift), not imported by insitu:

    /usr/bin/python3 _rings.py PLAN.json

PLAN: ``{"dir": D, "devices": ["d0", ...], "part_power": P,
"rings": {"account": [replicas, port], "container": [...], "object": [...],
"object-1": [...]}}``.

A ring whose ``D/NAME.builder`` is missing is created: one device per zone (so Swift puts
each replica, or each EC fragment, on a different device, and says nothing about
dispersion), weight 100, min_part_hours 0, then rebalanced with a fixed seed. A ring whose
builder exists keeps its partition assignment and only takes the new ports, so a cluster
brought up again on other ports finds its objects where they were. Either way
``D/NAME.ring.gz`` is written.
"""

import json
import os
import sys

from swift.common.ring import RingBuilder


def build(dir: str, name: str, replicas: int, port: int, devices: list, part_power: int) -> dict:
    builder_path = os.path.join(dir, name + ".builder")
    if os.path.exists(builder_path):
        b = RingBuilder.load(builder_path)
        for dev in b._iter_devs():
            dev["port"] = dev["replication_port"] = port
        b._ring = None  # the cached RingData holds the old ports
        created = False
    else:
        b = RingBuilder(part_power, replicas, 0)
        for i, dev in enumerate(devices):
            b.add_dev(
                {
                    "id": i,
                    "region": 1,
                    "zone": i + 1,
                    "ip": "127.0.0.1",
                    "port": port,
                    "replication_ip": "127.0.0.1",
                    "replication_port": port,
                    "device": dev,
                    "weight": 100.0,
                    "meta": "",
                }
            )
        b.rebalance(seed=1)
        created = True
    b.save(builder_path)
    b.get_ring().save(os.path.join(dir, name + ".ring.gz"))
    return {"ring": name, "created": created, "replicas": b.replicas, "partitions": b.parts, "devices": len(b.devs)}


def main() -> int:
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    out = [build(plan["dir"], name, int(r), int(port), plan["devices"], int(plan["part_power"])) for name, (r, port) in plan["rings"].items()]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
