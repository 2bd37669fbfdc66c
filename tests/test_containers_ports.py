# SPDX-License-Identifier: Apache-2.0
"""Container networking on a target, driven by the stock docker CLI: published ports
(`-p`, carried by the target daemon's userspace proxy into the container's network
namespace), `--network host` and `--network none` (docs/containers.md).

Everything listens on and connects to 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

from helpers import cli_json, free_port, run_cli
from test_containers import Env, busybox_registry, need


@pytest.fixture(scope="module")
def env():
    if os.geteuid() != 0:
        pytest.skip("containers need root (runc, overlayfs, loop devices)")
    need("docker", "runc", "docker-registry", "skopeo", "umoci")
    d = Path(tempfile.mkdtemp(prefix="insitu-ports-", dir="/var/tmp"))
    listen = None
    registry = contextlib.ExitStack()
    try:
        reg, image = registry.enter_context(busybox_registry(d))
        ns, priv = d / "ns.img", d / "private.img"
        cli_json("image", "create", ns, "--size", "64M", "--fs", "ext4")
        with open(priv, "wb") as f:
            f.truncate(1 << 30)
        listen, api = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        cli_json(
            "target", "start", "--listen", listen, "--nqn", "nqn.2024-01.io.insitu:ports", "--namespace", ns, "--private", priv, "--docker", api, timeout=120
        )
        (d / "docker-config").mkdir()
        e = Env(d, api, reg, image, d / "unused", listen)
        e.ok("pull", image)
        yield e
    finally:
        if listen:
            run_cli("target", "stop", "--listen", listen)
        registry.close()
        shutil.rmtree(d, ignore_errors=True)


def http_get(port: int, path: str = "/", deadline: float = 20) -> bytes:
    """GET over a plain socket, retried until the server in the container listens."""
    end = time.time() + deadline
    last = None
    while time.time() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
            if data.startswith(b"HTTP/"):
                return data
            last = data
        except OSError as e:
            last = e
        time.sleep(0.2)
    raise AssertionError(f"no HTTP answer on 127.0.0.1:{port}: {last!r}")


def test_a_published_port_reaches_a_server_in_the_container(env):
    port = free_port()
    page = "hello from the drive " * 2000  # 42 KB, more than one segment each way
    cid = env.ok(
        "run",
        "-d",
        "--name",
        "web",
        "-p",
        f"127.0.0.1:{port}:8080",
        env.image,
        "sh",
        "-c",
        f"mkdir -p /www && echo -n '{page}' > /www/index.html && exec httpd -f -p 8080 -h /www",
    ).strip()
    try:
        got = http_get(port, "/index.html")
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.split()[1] == b"200" and body.decode() == page
        # docker port, docker ps and inspect show it.
        assert env.ok("port", "web").strip() == f"8080/tcp -> 127.0.0.1:{port}"
        assert env.ok("port", "web", "8080").strip() == f"127.0.0.1:{port}"
        assert f"127.0.0.1:{port}->8080/tcp" in env.ok("ps", "--format", "{{.Ports}}", "--filter", "name=web")
        doc = json.loads(env.ok("inspect", cid))[0]
        assert doc["NetworkSettings"]["Ports"] == {"8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]}
        assert doc["HostConfig"]["PortBindings"] == {"8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]}
        assert "8080/tcp" in doc["Config"]["ExposedPorts"]
        # Several connections at once.
        socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(5)]
        for s in socks:
            s.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
        for s in socks:
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            s.close()
            assert data.endswith(page.encode())
    finally:
        env.ok("stop", "-t", "1", "web")
    # Closed with the container.
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert env.ok("port", "web").strip() == ""
    # A restart publishes it again.
    env.ok("start", "web")
    try:
        assert http_get(port, "/index.html").split()[1] == b"200"
    finally:
        env.ok("rm", "-f", "web")


def test_an_echo_server_with_nc_and_a_port_the_kernel_picks(env):
    env.ok("run", "-d", "--name", "echo", "-p", "127.0.0.1::7000", env.image, "sh", "-c", "while true; do nc -l -p 7000 -e cat; done")
    try:
        mapped = env.ok("port", "echo", "7000/tcp").strip()
        host, port = mapped.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        end = time.time() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", int(port)), timeout=5) as s:
                    s.sendall(b"ping over the proxy\n")
                    s.shutdown(socket.SHUT_WR)
                    data = b""
                    while chunk := s.recv(4096):
                        data += chunk
                if data == b"ping over the proxy\n":
                    break
            except OSError:
                pass
            assert time.time() < end, "the echo server never answered"
            time.sleep(0.2)
    finally:
        env.ok("rm", "-f", "echo")


def test_host_network_shares_the_targets_namespace_and_none_has_loopback_only(env):
    port = free_port()
    env.ok(
        "run",
        "-d",
        "--name",
        "hostnet",
        "--network",
        "host",
        env.image,
        "sh",
        "-c",
        f"mkdir -p /www && echo hi > /www/index.html && exec httpd -f -p 127.0.0.1:{port} -h /www",
    )
    try:
        assert http_get(port, "/index.html").endswith(b"hi\n")
        assert json.loads(env.ok("inspect", "hostnet"))[0]["HostConfig"]["NetworkMode"] == "host"
    finally:
        env.ok("rm", "-f", "hostnet")
    out = env.ok("run", "--rm", "--network", "none", env.image, "sh", "-c", "ls /sys/class/net")
    assert out.split() == ["lo"]
    # The default is a namespace of the container's own too: the target's loopback services
    # (its Docker API, here) are out of reach.
    api_port = env.api.rsplit(":", 1)[1]
    r = env.docker("run", "--rm", env.image, "sh", "-c", f"echo | nc -w 2 127.0.0.1 {api_port}")
    assert r.returncode != 0
    assert env.ok("run", "--rm", env.image, "ls", "/sys/class/net").split() == ["lo"]


def test_bad_port_requests_get_clear_errors(env):
    def create(host_config: dict, **extra) -> tuple[int, str]:
        body = {"Image": env.image, "Cmd": ["true"], "HostConfig": host_config, **extra}
        status, text = env.request("POST", "/containers/create", json.dumps(body).encode(), {"Content-Type": "application/json"})
        return status, text.decode()

    before = set(env.ok("ps", "-aq", "--no-trunc").split())
    for hc, why in [
        ({"PortBindings": {"53/sctp": [{"HostIp": "127.0.0.1", "HostPort": "5353"}]}}, "TCP and UDP only"),
        ({"PortBindings": {"0/tcp": [{"HostPort": "1"}]}}, "invalid port"),
        ({"PortBindings": {"80/tcp": [{"HostPort": "70000"}]}}, "invalid host port"),
        ({"PortBindings": {"80/tcp": [{"HostIp": "localhost", "HostPort": "8080"}]}}, "invalid host IP"),
        ({"PortBindings": {"80/tcp": [{"HostPort": "8080"}], "81/tcp": [{"HostPort": "8080"}]}}, "twice"),
        ({"PortBindings": ["80:80"]}, "PortBindings"),
        ({"NetworkMode": "host", "PortBindings": {"80/tcp": [{"HostPort": "8080"}]}}, "conflicting options"),
        ({"NetworkMode": "none", "PortBindings": {"80/tcp": [{"HostPort": "8080"}]}}, "conflicting options"),
        ({"NetworkMode": "container:other"}, "not supported"),
    ]:
        status, text = create(hc)
        assert status == 400 and why in text, (hc, status, text)
    status, text = create({"NetworkMode": "no-such-net"})
    assert status == 404 and "network no-such-net not found" in text, (status, text)
    status, text = create({}, ExposedPorts={"80/sctp": {}})
    assert status == 400 and "TCP and UDP only" in text
    # The stock CLI reaches the same refusal for SCTP.
    r = env.docker("run", "--rm", "-p", "127.0.0.1:5353:53/sctp", env.image, "true")
    assert r.returncode != 0 and "TCP and UDP only" in r.stderr
    assert set(env.ok("ps", "-aq", "--no-trunc").split()) == before

    # A host port in use: the start fails with a clear message, nothing runs.
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        r = env.docker("run", "--rm", "-p", f"127.0.0.1:{port}:80", env.image, "true")
        assert r.returncode != 0 and "already in use" in r.stderr and str(port) in r.stderr, r.stderr
        r = env.docker("run", "-d", "--name", "clash", "-p", f"127.0.0.1:{port}:80", env.image, "true")
        assert r.returncode != 0 and "already in use" in r.stderr
        assert json.loads(env.ok("inspect", "clash"))[0]["State"]["Running"] is False
    finally:
        busy.close()
        env.docker("rm", "-f", "clash")
    assert set(env.ok("ps", "-aq", "--no-trunc").split()) == before
