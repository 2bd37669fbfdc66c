# SPDX-License-Identifier: Apache-2.0
"""Ethernet over NVMe (Ether-oN) end to end, in two network namespaces this module makes
and removes: A holds the target, B the host, joined by a veth pair (10.199.0.2/24 and
10.199.0.1/24) that carries NVMe/TCP only. The target starts with `--ether 10.77.0.2/24`,
the host runs `insitu ethernet up ... --address 10.77.0.1/24`; 10.77.0.0/24 exists only as
Ethernet frames inside vendor NVMe commands. Then: ping, a 64 MiB TCP transfer each way
(checked by byte count and SHA-256, throughput printed), and the stock docker CLI running a
container on the target through the Ether-oN address.

Commands run in a namespace with `nsenter --net=...`, which changes only the network
namespace (`ip netns exec` also remounts /sys, which hides the cgroup file system runc
needs). Nothing is sent outside the two namespaces.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import INSITU, ROOT, free_port

SIZE = 64 << 20
TARGET_IP, HOST_IP = "10.77.0.2", "10.77.0.1"

BULK = r"""
import hashlib, socket, sys, time
mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(1); print("ready", flush=True)
    s.settimeout(60); c, _ = s.accept(); c.settimeout(60)
    h, n = hashlib.sha256(), 0
    while True:
        b = c.recv(1 << 20)
        if not b: break
        h.update(b); n += len(b)
    c.sendall(b"k"); print(n, h.hexdigest(), flush=True)
else:
    size = int(sys.argv[4]); block = bytes(range(256)) * 4096 * 4  # 4 MiB pattern
    data = (block * (size // len(block) + 1))[:size]
    c = socket.create_connection((addr, port), timeout=60)
    t0 = time.time(); c.sendall(data); c.shutdown(socket.SHUT_WR); c.recv(1)
    print(time.time() - t0, flush=True)
"""


def _expected_digest(size: int) -> str:
    block = bytes(range(256)) * 4096 * 4
    return hashlib.sha256((block * (size // len(block) + 1))[:size]).hexdigest()


def _run(*args, check=True, timeout=60, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited {p.returncode}: {p.stderr.strip()}")
    return p


class Link:
    def __init__(self, ns_a: str, ns_b: str, d: Path, port: int, docker: str | None):
        self.ns_a, self.ns_b, self.d, self.port, self.docker_api = ns_a, ns_b, d, port, docker

    def in_ns(self, ns: str) -> list:
        return ["nsenter", f"--net=/run/netns/{ns}"]

    def a(self, *args, **kw):
        return _run(*self.in_ns(self.ns_a), *args, **kw)

    def b(self, *args, **kw):
        return _run(*self.in_ns(self.ns_b), *args, **kw)


def _docker_ready() -> bool:
    return all(shutil.which(t) for t in ("docker", "runc", "umoci", "skopeo"))


@pytest.fixture(scope="module")
def link():
    if os.geteuid() != 0:
        pytest.skip("Ether-oN needs root: network namespaces and TAP devices")
    if not Path("/dev/net/tun").exists():
        pytest.skip("Ether-oN needs /dev/net/tun (modprobe tun)")
    for tool in ("ip", "nsenter"):
        if not shutil.which(tool):
            pytest.skip(f"missing {tool} (iproute2, util-linux)")
    if not Path(INSITU).exists():
        pytest.skip(f"{INSITU} not found: run `make build` first")
    tag = f"{os.getpid() % 100000}"
    ns_a, ns_b, veth_a, veth_b = f"isn-a{tag}", f"isn-b{tag}", f"isva{tag}", f"isvb{tag}"
    d = Path(tempfile.mkdtemp(prefix="insitu-etheron-", dir="/var/tmp"))
    port = free_port()
    listen = f"10.199.0.2:{port}"
    made = []
    try:
        for ns in (ns_a, ns_b):
            _run("ip", "netns", "add", ns)
            made.append(ns)
        _run("ip", "link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
        _run("ip", "link", "set", veth_a, "netns", ns_a)
        _run("ip", "link", "set", veth_b, "netns", ns_b)
        for ns, dev, addr in ((ns_a, veth_a, "10.199.0.2/24"), (ns_b, veth_b, "10.199.0.1/24")):
            _run("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        img = d / "ns.img"
        with open(img, "wb") as f:
            f.truncate(64 << 20)
        lk = Link(ns_a, ns_b, d, port, None)
        extra = []
        if _docker_ready():
            priv = d / "private.img"
            with open(priv, "wb") as f:
                f.truncate(512 << 20)
            lk.docker_api = f"{TARGET_IP}:2375"
            extra = ["--private", priv, "--docker", lk.docker_api]
        lk.a(INSITU, "target", "start", "--listen", listen, "--namespace", img, "--ether", f"{TARGET_IP}/24", *extra, "--json", timeout=120)
        made.append(("target", listen))
        up = json.loads(lk.b(INSITU, "ethernet", "up", f"nvme-tcp://{listen}", "--address", f"{HOST_IP}/24", "--json").stdout)
        made.append(("ethernet", HOST_IP))
        assert up["device"].startswith("isn-") and up["url"].endswith("nqn.2024-01.io.insitu:target"), up
        yield lk
    finally:
        for m in reversed(made):
            if m[0] == "ethernet":
                _run(INSITU, "ethernet", "down", "--address", m[1], check=False)
            elif m[0] == "target":
                _run(INSITU, "target", "stop", "--listen", m[1], check=False, timeout=120)
            else:
                _run("ip", "netns", "del", m, check=False)
        shutil.rmtree(d, ignore_errors=True)


def test_the_storage_link_is_the_only_way(link):
    # The host namespace has no route to 10.77.0.0/24 except the Ether-oN device.
    routes = link.b("ip", "route").stdout
    dev = [l for l in routes.splitlines() if l.startswith("10.77.0.0/24")]
    assert len(dev) == 1 and "dev isn-" in dev[0], routes
    # And the target's side answers on the storage link's address for NVMe/TCP only.
    assert "10.77.0.2" not in link.b("ip", "addr").stdout


def test_ping(link, record_property):
    ping = ["ping"] if shutil.which("ping") else ["busybox", "ping"]
    p = link.b(*ping, "-c", "3", "-W", "2", TARGET_IP, timeout=30)
    assert " 0% packet loss" in p.stdout, p.stdout
    rtt = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)", p.stdout)
    print(f"\nEther-oN ping {TARGET_IP}: min/avg/max {rtt.group(1)}/{rtt.group(2)}/{rtt.group(3)} ms")
    record_property("ping_avg_ms", float(rtt.group(2)))


@pytest.mark.parametrize("direction", ["host-to-target", "target-to-host"])
def test_bulk_transfer(link, direction, record_property):
    port = 5001 if direction == "host-to-target" else 5002
    recv_ns, send_ns, dst = (link.ns_a, link.ns_b, TARGET_IP) if direction == "host-to-target" else (link.ns_b, link.ns_a, HOST_IP)
    script = link.d / "bulk.py"
    script.write_text(BULK)
    rx = subprocess.Popen([*link.in_ns(recv_ns), sys.executable, script, "recv", dst, str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert rx.stdout.readline().strip() == "ready"
        tx = _run(*link.in_ns(send_ns), sys.executable, script, "send", dst, port, SIZE, timeout=180)
        out, err = rx.communicate(timeout=60)
    finally:
        rx.kill()
    n, digest = out.split()
    assert int(n) == SIZE and digest == _expected_digest(SIZE), (out, err)
    seconds = float(tx.stdout.strip())
    rate = SIZE / seconds / 1e6
    print(f"\nEther-oN {direction}: {SIZE >> 20} MiB in {seconds:.2f} s = {rate:.1f} MB/s")
    record_property(f"{direction}_MBps", rate)


def test_docker_runs_a_container_over_the_ethernet_link(link):
    if not link.docker_api:
        pytest.skip("missing docker, runc, umoci or skopeo (make deps installs them)")
    oci, tar = link.d / "oci", link.d / "busybox.tar"
    _run("bash", ROOT / "tests" / "containers" / "busybox-oci.sh", oci, "latest", timeout=120)
    _run("skopeo", "copy", "--quiet", f"oci:{oci}:latest", f"docker-archive:{tar}:busybox:latest", timeout=120)
    (link.d / "docker-config").mkdir(exist_ok=True)
    env = {**os.environ, "DOCKER_HOST": f"tcp://{link.docker_api}", "DOCKER_CONFIG": str(link.d / "docker-config")}
    docker = [*link.in_ns(link.ns_b), "docker"]
    _run(*docker, "load", "-i", tar, env=env, timeout=120)
    p = _run(*docker, "run", "--rm", "busybox:latest", "sh", "-c", "echo over ether-on; exit 3", env=env, check=False, timeout=120)
    assert p.returncode == 3 and p.stdout.strip() == "over ether-on", (p.returncode, p.stdout, p.stderr)
    assert "busybox" in _run(*docker, "images", env=env).stdout
