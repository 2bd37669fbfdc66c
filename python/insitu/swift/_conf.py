# SPDX-License-Identifier: Apache-2.0
"""The text of a single-node Swift cluster's configuration: ``swift.conf`` (hash path
secrets and the two storage policies) and one paste-deploy file per server.

Everything here is a pure function of its arguments, so the layout is easy to read and to
check; :mod:`insitu.swift.cluster` writes the results into the cluster's directory.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Dict

#: tempauth account, user and key of every cluster (loopback only: a test credential).
ACCOUNT, USER, KEY = "test", "tester", "testing"

#: Swift servers this module configures, in the order they are started.
SERVERS = ("account", "container", "object", "proxy")

#: The erasure-coded policy's name and index; policy 0 is the replicated one.
EC_POLICY_NAME, EC_POLICY_INDEX = "ec", 1
REPLICATED_POLICY_NAME = "replicated"


@dataclasses.dataclass(frozen=True)
class Ec:
    """An erasure code: `k` data and `m` parity fragments per segment."""

    k: int
    m: int

    @property
    def n(self) -> int:
        """Fragments per segment, and so devices in the cluster."""
        return self.k + self.m

    def __str__(self) -> str:
        return f"{self.k}+{self.m}"


def parse_ec(text: str) -> Ec:
    """`K+M` as given to ``--ec``, e.g. ``"4+2"``; ValueError says what is wrong."""
    m = re.fullmatch(r"\s*(\d+)\s*\+\s*(\d+)\s*", text or "")
    if not m:
        raise ValueError(f"--ec {text!r}: give data and parity fragments as K+M, e.g. --ec 4+2")
    k, p = int(m.group(1)), int(m.group(2))
    if k < 1:
        raise ValueError(f"--ec {text}: K (data fragments) must be at least 1")
    if p < 1:
        raise ValueError(f"--ec {text}: M (parity fragments) must be at least 1; for no parity use a replicated store")
    if k + p > 32:
        # liberasurecode's limit on k + m; one device per fragment on one node is plenty.
        raise ValueError(f"--ec {text}: at most 32 fragments in all (K+M), one device each")
    return Ec(k, p)


@dataclasses.dataclass
class Ports:
    """The loopback TCP ports of one cluster."""

    proxy: int
    account: int
    container: int
    object: int
    memcached: int

    def as_dict(self) -> Dict[str, int]:
        return dataclasses.asdict(self)


def swift_conf(prefix: str, suffix: str, ec: Ec, ec_type: str, segment_size: int) -> str:
    """``swift.conf``: the hash path secrets, policy 0 (replicated, one replica) and policy
    1 (erasure-coded, the default for new containers)."""
    return f"""\
# A single-node Swift cluster made by `insitu swift up`.
[swift-hash]
# Random per cluster: they salt the hash that places every object on the rings.
swift_hash_path_prefix = {prefix}
swift_hash_path_suffix = {suffix}

[storage-policy:0]
name = {REPLICATED_POLICY_NAME}
policy_type = replication

[storage-policy:{EC_POLICY_INDEX}]
name = {EC_POLICY_NAME}
policy_type = erasure_coding
ec_type = {ec_type}
ec_num_data_fragments = {ec.k}
ec_num_parity_fragments = {ec.m}
ec_object_segment_size = {segment_size}
default = yes
"""


def _default(dir: Path, port: int) -> str:
    # `user = root`: the devices are root's mounts, and the servers run as the supervisor's
    # user rather than Debian's `swift`. Logs go to the console (`-v`), which the
    # supervisor points at DIR/log/NAME.log, rather than to a syslog that may not exist.
    return f"""\
[DEFAULT]
bind_ip = 127.0.0.1
bind_port = {port}
# One process per server: a small cluster on a small machine.
workers = 0
user = root
swift_dir = {dir}
devices = {dir / "node"}
# Devices must be real mounts (the XFS file systems on insitu namespaces): a device whose
# mount went away is skipped rather than filled on the directory underneath.
mount_check = true
recon_cache_path = {dir / "run" / "recon"}
log_level = INFO
"""


def proxy_conf(dir: Path, ports: Ports) -> str:
    """``proxy-server.conf``: tempauth with one admin user, memcached on its own port."""
    return (
        _default(dir, ports.proxy)
        + f"""
[pipeline:main]
pipeline = catch_errors gatekeeper healthcheck proxy-logging cache listing_formats tempauth copy slo dlo proxy-logging proxy-server

[app:proxy-server]
use = egg:swift#proxy
# The tempauth account exists as soon as it is used.
account_autocreate = true

[filter:tempauth]
use = egg:swift#tempauth
user_{ACCOUNT}_{USER} = {KEY} .admin

[filter:cache]
use = egg:swift#memcache
memcache_servers = 127.0.0.1:{ports.memcached}

[filter:catch_errors]
use = egg:swift#catch_errors

[filter:gatekeeper]
use = egg:swift#gatekeeper

[filter:healthcheck]
use = egg:swift#healthcheck

[filter:proxy-logging]
use = egg:swift#proxy_logging

[filter:listing_formats]
use = egg:swift#listing_formats

[filter:copy]
use = egg:swift#copy

[filter:slo]
use = egg:swift#slo

[filter:dlo]
use = egg:swift#dlo
"""
    )


def account_conf(dir: Path, ports: Ports) -> str:
    """``account-server.conf``."""
    return (
        _default(dir, ports.account)
        + """
[pipeline:main]
pipeline = healthcheck recon account-server

[app:account-server]
use = egg:swift#account

[filter:healthcheck]
use = egg:swift#healthcheck

[filter:recon]
use = egg:swift#recon

[account-replicator]
[account-auditor]
[account-reaper]
"""
    )


def container_conf(dir: Path, ports: Ports) -> str:
    """``container-server.conf``."""
    return (
        _default(dir, ports.container)
        + """
[pipeline:main]
pipeline = healthcheck recon container-server

[app:container-server]
use = egg:swift#container

[filter:healthcheck]
use = egg:swift#healthcheck

[filter:recon]
use = egg:swift#recon

[container-replicator]
[container-updater]
[container-auditor]
[container-sync]
"""
    )


def object_conf(dir: Path, ports: Ports) -> str:
    """``object-server.conf``, with the sections its background daemons read when run
    with ``insitu swift once``."""
    return (
        _default(dir, ports.object)
        + """
[pipeline:main]
pipeline = healthcheck recon object-server

[app:object-server]
use = egg:swift#object

[filter:healthcheck]
use = egg:swift#healthcheck

[filter:recon]
use = egg:swift#recon

[object-replicator]
# ssync over the object server's own port: no rsync daemon to run.
sync_method = ssync

[object-reconstructor]

[object-updater]

[object-auditor]
# Unthrottled (Swift's defaults are 20 files/s and 10 MB/s): a pass shows what the
# machine can do, which is what a timing wants. The zero-byte-file pass is off; the full
# pass reads every byte anyway.
files_per_second = 0
bytes_per_second = 0
zero_byte_files_per_second = 0
"""
    )


CONFS = {
    "account": account_conf,
    "container": container_conf,
    "object": object_conf,
    "proxy": proxy_conf,
}


def conf_path(dir: Path, server: str) -> Path:
    """Where a server's configuration lives in the cluster directory."""
    return dir / f"{server}-server.conf"
