# SPDX-License-Identifier: Apache-2.0
"""Containers on a target, driven by the stock docker CLI (DockerSSD).

A target daemon serves a sharable namespace (ext4 with a data set the host wrote) and a
private one (images and containers), with the Docker Engine API on loopback. Debian's
docker-registry, also on loopback, holds a busybox image built offline with umoci and
pushed with skopeo. Everything talks to 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from helpers import INSITU, ROOT, cli_json, free_port, run_cli

FIXTURES = ROOT / "tests" / "containers"
DOCKER = shutil.which("docker")
LINES = 54_321


def need(*tools: str) -> None:
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        pytest.skip(f"missing {', '.join(missing)} (make deps installs them)")


class Env:
    def __init__(self, d: Path, api: str, registry: str, image: str, data_mnt: Path, target_listen: str):
        self.d, self.api, self.registry, self.image, self.data_mnt, self.target_listen = d, api, registry, image, data_mnt, target_listen
        self.env = {**os.environ, "DOCKER_HOST": f"tcp://{api}", "DOCKER_CONFIG": str(d / "docker-config")}

    def docker(self, *args: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([DOCKER, *args], input=input, capture_output=True, text=True, env=self.env, timeout=timeout)

    def ok(self, *args: str, **kw) -> str:
        p = self.docker(*args, **kw)
        assert p.returncode == 0, f"docker {' '.join(args)} exited {p.returncode}: {p.stderr.strip()}"
        return p.stdout

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        host, port = self.api.rsplit(":", 1)
        c = http.client.HTTPConnection(host, int(port), timeout=30)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data


@contextlib.contextmanager
def busybox_registry(d: Path, repository: str = "busybox", name: str = "registry"):
    """Debian's docker-registry on a free loopback port, its data under `d / name`, holding
    a busybox image built offline as `repository`; yields (registry address, image
    reference)."""
    port = free_port()
    oci = d / "oci"
    if not oci.exists():
        subprocess.run(["bash", FIXTURES / "busybox-oci.sh", oci, "latest"], check=True, capture_output=True)
    subprocess.run(["bash", FIXTURES / "registry.sh", "start", d / name, str(port)], check=True, capture_output=True)
    try:
        image = f"127.0.0.1:{port}/{repository}:latest"
        subprocess.run(["bash", FIXTURES / "push.sh", oci, "latest", image], check=True, capture_output=True)
        yield f"127.0.0.1:{port}", image
    finally:
        subprocess.run(["bash", FIXTURES / "registry.sh", "stop", d / name], capture_output=True)


@contextlib.contextmanager
def docker_target(d: Path, nqn: str, namespace: Path, *options: object) -> Iterator[tuple[str, str]]:
    """`insitu target start` on a free loopback port with `namespace` (sharable), a blank
    1 GiB private namespace made in `d`, and the Docker API on another free loopback port;
    `options` are more options of `target start`. Also makes the docker CLI's empty
    configuration directory, `d / "docker-config"` (see `Env`). Yields (fabric address, API
    address); the target is stopped at the end."""
    priv = d / "private.img"
    with open(priv, "wb") as f:
        f.truncate(1 << 30)
    listen, api = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    try:
        cli_json("target", "start", "--listen", listen, "--nqn", nqn, "--namespace", namespace, "--private", priv, "--docker", api, *options, timeout=120)
        (d / "docker-config").mkdir()
        yield listen, api
    finally:
        run_cli("target", "stop", "--listen", listen)


@pytest.fixture(scope="module")
def env():
    if os.geteuid() != 0:
        pytest.skip("containers need root (runc, overlayfs, loop devices)")
    need("docker", "runc", "docker-registry", "skopeo", "umoci")
    d = Path(tempfile.mkdtemp(prefix="insitu-containers-", dir="/var/tmp"))
    data_mnt = d / "data-mnt"
    stack = contextlib.ExitStack()
    try:
        reg, image = stack.enter_context(busybox_registry(d))
        # The sharable namespace: ext4 the host fills with a data set.
        ns = d / "ns.img"
        cli_json("image", "create", ns, "--size", "256M", "--fs", "ext4")
        cli_json("image", "mount", ns, data_mnt)
        with open(data_mnt / "lines.txt", "w") as f:
            for i in range(LINES):
                f.write(f"record {i} {'x' * (i % 17)}\n")
        (data_mnt / "secret-dir").mkdir()
        os.sync()
        target_listen, api = stack.enter_context(docker_target(d, "nqn.2024-01.io.insitu:containers", ns))
        yield Env(d, api, reg, image, data_mnt, target_listen)
    finally:
        stack.close()
        if data_mnt.exists():
            run_cli("image", "umount", data_mnt)
        shutil.rmtree(d, ignore_errors=True)


def test_version_and_info_negotiate(env):
    out = env.ok("version", "--format", "{{.Server.APIVersion}} {{.Server.Os}}")
    api, os_ = out.split()
    assert tuple(map(int, api.split("."))) >= (1, 44) and os_ == "linux"
    assert "insitu" in env.ok("info", "--format", "{{.OperatingSystem}}")


def test_pull_run_counts_lines_of_the_sharable_namespace(env):
    out = env.ok("pull", env.image)
    assert "Digest: sha256:" in out
    assert env.image.rsplit(":", 1)[0] in env.ok("images")
    host = subprocess.run(["wc", "-l", str(env.data_mnt / "lines.txt")], capture_output=True, text=True, check=True).stdout.split()[0]
    out = env.ok("run", "--rm", env.image, "wc", "-l", "/data/lines.txt")
    assert out.split()[0] == host == str(LINES)


def test_exit_codes_propagate(env):
    assert env.docker("run", "--rm", env.image, "sh", "-c", "exit 3").returncode == 3
    assert env.docker("run", "--rm", env.image, "true").returncode == 0
    assert env.docker("run", "--rm", env.image, "false").returncode == 1


def test_stdin_passes_through(env):
    out = env.ok("run", "-i", "--rm", env.image, "sh", "-c", "wc -l; echo done >&2", input="a\nb\nc\n")
    assert out.strip() == "3"
    out = env.ok("run", "-i", "--rm", env.image, "md5sum", input="hello\n")
    assert out.split()[0] == "b1946ac92492d2347c6235b4d2611184"


def test_env_workdir_volume_and_limits(env):
    out = env.ok("run", "--rm", "-e", "GREETING=hi there", "-w", "/tmp", "--cpus", "0.5", "--memory", "64m", env.image, "sh", "-c", "echo $GREETING; pwd")
    assert out.split("\n")[:2] == ["hi there", "/tmp"]
    # A named volume lives in the private namespace and outlives the container.
    env.ok("run", "--rm", "-v", "results:/out", env.image, "sh", "-c", "wc -l < /data/lines.txt > /out/count")
    out = env.ok("run", "--rm", "-v", "results:/out:ro", env.image, "cat", "/out/count")
    assert out.strip() == str(LINES)
    # A sub-tree of the sharable namespace, read-only.
    out = env.ok("run", "--rm", "-v", "/secret-dir:/in:ro", env.image, "ls", "-la", "/in")
    assert "total" in out
    r = env.docker("run", "--rm", "-v", "/secret-dir:/in:rw", env.image, "true")
    assert r.returncode != 0 and "read-only to containers" in r.stderr


def test_detached_lifecycle_ps_logs_stop_restart_rm(env):
    name = "looper"
    cid = env.ok("run", "-d", "--name", name, env.image, "sh", "-c", "echo started; i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done").strip()
    assert len(cid) == 64
    assert name in env.ok("ps")
    deadline = time.time() + 20
    while "tick 2" not in env.ok("logs", name) and time.time() < deadline:
        time.sleep(0.2)
    logs = env.ok("logs", name)
    assert logs.startswith("started\ntick 0\n")
    # logs -f follows until the container stops.
    follow = subprocess.Popen([DOCKER, "logs", "-f", name], stdout=subprocess.PIPE, text=True, env=env.env)
    time.sleep(1)
    env.ok("stop", "-t", "1", name)
    rest, _ = follow.communicate(timeout=30)
    assert follow.returncode == 0 and "tick 5" in rest
    ps = env.ok("ps", "-a", "--format", "{{.Names}} {{.Status}}")
    assert any(l.startswith(f"{name} Exited") for l in ps.splitlines()), ps
    assert name not in env.ok("ps", "--format", "{{.Names}}")
    env.ok("restart", "-t", "1", name)
    assert name in env.ok("ps", "--format", "{{.Names}}")
    assert json.loads(env.ok("inspect", name))[0]["State"]["Running"] is True
    env.ok("kill", name)
    assert env.ok("wait", name).strip() == "137"
    env.ok("rm", name)
    assert name not in env.ok("ps", "-a", "--format", "{{.Names}}")
    r = env.docker("logs", name)
    assert r.returncode != 0 and "No such container" in r.stderr


def test_rm_of_a_running_container_needs_force(env):
    env.ok("run", "-d", "--name", "busy", env.image, "sleep", "60")
    r = env.docker("rm", "busy")
    assert r.returncode != 0 and "running" in r.stderr
    env.ok("rm", "-f", "busy")
    assert "busy" not in env.ok("ps", "-a", "--format", "{{.Names}}")


def test_auto_remove_and_create_start(env):
    before = set(env.ok("ps", "-aq", "--no-trunc").split())
    env.ok("run", "--rm", env.image, "true")
    assert set(env.ok("ps", "-aq", "--no-trunc").split()) == before
    cid = env.ok("create", "--name", "made", env.image, "sh", "-c", "echo from create").strip()
    assert "Created" in env.ok("ps", "-a", "--filter", "name=made", "--format", "{{.Status}}") or cid
    out = env.ok("start", "-a", "made")
    assert out.strip() == "from create"
    env.ok("rm", "made")


def test_isolation_and_escape_attempts_fail(env):
    # No block devices, and making one does not help.
    out = env.ok("run", "--rm", env.image, "ls", "/dev")
    assert not any(x.startswith(("loop", "sd", "nvme", "vd", "dm-")) for x in out.split())
    r = env.docker("run", "--rm", env.image, "sh", "-c", "mknod /tmp/b b 7 0 && head -c 1 /tmp/b")
    assert r.returncode != 0
    # Mounting (proc of the host, the host's disk) is refused.
    assert env.docker("run", "--rm", env.image, "sh", "-c", "mkdir -p /m && mount -t proc proc /m").returncode != 0
    # The sharable namespace is read-only; the host's files are not there.
    r = env.docker("run", "--rm", env.image, "sh", "-c", "echo x > /data/lines.txt")
    assert r.returncode != 0
    assert "record 0" in (env.data_mnt / "lines.txt").read_text()[:20]
    out = env.ok("run", "--rm", env.image, "sh", "-c", "ls /; cat /proc/1/cmdline | tr '\\0' ' '")
    assert "work" not in out.split() and "var" not in out.split()
    # Another container's files are not visible.
    env.ok("run", "-d", "--name", "holder", env.image, "sh", "-c", "echo topsecret > /root-secret; sleep 30")
    out = env.docker("run", "--rm", env.image, "sh", "-c", "find / -name root-secret 2>/dev/null; grep -rl topsecret /tmp /data 2>/dev/null; true")
    assert "root-secret" not in out.stdout and "topsecret" not in out.stdout
    env.ok("rm", "-f", "holder")


def test_private_namespace_is_invisible_to_the_host(env):
    # Over the fabric the host sees only the sharable namespace; the private one, which
    # holds the images and containers, can be neither listed nor addressed.
    url = f"nvme-tcp://{env.target_listen}/nqn.2024-01.io.insitu:containers"
    doc = cli_json("nvme", "identify", url)
    assert [n["nsid"] for n in doc["namespaces"]] == [1]
    r = run_cli("nvme", "identify", f"{url}/2")
    assert r.rc != 0 and "not active" in r.stderr


def test_bad_input_gets_clear_errors_and_changes_nothing(env):
    images_before = env.ok("images", "-q", "--no-trunc")
    st, body = env.request("POST", "/v1.47/containers/create", b"{not json", {"Content-Type": "application/json"})
    assert st == 400 and b"malformed JSON" in body
    st, body = env.request("POST", "/v1.47/containers/create", json.dumps({"Image": "nope/unknown:1"}).encode(), {"Content-Type": "application/json"})
    assert st == 404 and b"No such image" in body
    r = env.docker("run", "--rm", f"{env.registry}/does-not-exist:1", "true")
    assert r.returncode != 0 and r.stderr.strip()
    # A huge header is refused; the daemon keeps serving.
    host, port = env.api.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"GET /_ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
        try:
            reply = s.recv(4096)
        except (ConnectionResetError, socket.timeout):
            reply = b""
    assert not reply.startswith(b"HTTP/1.1 200")
    # A layer that escapes its directory is refused by docker load.
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w") as t:
        layer = io.BytesIO()
        with tarfile.open(fileobj=layer, mode="w") as lt:
            info = tarfile.TarInfo("../../escaped")
            info.size = 3
            lt.addfile(info, io.BytesIO(b"bad"))
        import hashlib

        diff = hashlib.sha256(layer.getvalue()).hexdigest()
        cfg = json.dumps(
            {"architecture": "amd64", "os": "linux", "config": {"Cmd": ["sh"]}, "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff}"]}}
        ).encode()
        cfg_name = hashlib.sha256(cfg).hexdigest() + ".json"
        for name, data in [
            ("layer.tar", layer.getvalue()),
            (cfg_name, cfg),
            ("manifest.json", json.dumps([{"Config": cfg_name, "RepoTags": ["evil:1"], "Layers": ["layer.tar"]}]).encode()),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    p = subprocess.run([DOCKER, "load"], input=evil.getvalue(), capture_output=True, env=env.env, timeout=60)
    assert p.returncode != 0 and b"escape" in p.stderr.lower()
    assert not Path("/escaped").exists()
    assert env.ok("images", "-q", "--no-trunc") == images_before
    assert env.ok("run", "--rm", env.image, "echo", "still fine").strip() == "still fine"


def test_rmi_and_auto_pull(env):
    env.ok("pull", env.image)
    env.ok("rmi", env.image)
    assert env.image.rsplit(":", 1)[0] not in env.ok("images")
    # run pulls what it does not have.
    p = env.docker("run", "--rm", env.image, "echo", "pulled")
    assert p.returncode == 0 and p.stdout.strip() == "pulled"
    assert "Unable to find image" in p.stderr


def test_host_container_locks(env, tmp_path):
    """DockerSSD's inode lock: while a container holds a file, host writes to it are
    refused (through the mount and at the block level); after release the container sees
    the host's new content; a target restart drops locks."""
    sys_path = str(ROOT / "python")
    import sys

    if sys_path not in sys.path:
        sys.path.insert(0, sys_path)
    import insitu  # the binding built by `make build`

    d = env.d / "locks"
    d.mkdir()
    ns, priv, mnt = d / "ns.img", d / "priv.img", d / "mnt"
    for p, size in [(ns, 256 << 20), (priv, 256 << 20)]:
        with open(p, "wb") as f:
            f.truncate(size)
    listen, api, nqn = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}", "nqn.2024-01.io.insitu:locks"
    start = ["target", "start", "--listen", listen, "--nqn", nqn, "--namespace", ns, "--private", priv, "--docker", api]
    cli_json(*start, timeout=120)
    denv = Env(env.d, api, env.registry, env.image, mnt, listen)
    try:
        cli_json("attach", f"nvme-tcp://{listen}/{nqn}/1", mnt, "--format", "ext4", timeout=120)
        f = mnt / "shared.txt"
        f.write_text("v1\n")
        doc = cli_json("lock", f)
        assert doc["lock_id"] >= 1 and cli_json("lock", "--list")["locks"][0]["path"] == str(f)
        with pytest.raises(OSError) as e:
            with open(f, "a") as w:
                w.write("host write\n")
        assert e.value.errno == 30  # EROFS, at once
        assert f.read_text() == "v1\n"
        # Below the file system too: a raw write into the file's blocks is refused by the target.
        import fcntl
        import struct

        with open(f, "rb") as fh:
            buf = bytearray(struct.pack("=QQLLLL", 0, 1 << 30, 0, 0, 1, 0) + bytes(56))
            fcntl.ioctl(fh.fileno(), 0xC020660B, buf)
            physical = struct.unpack_from("=QQQ", buf, 32)[1]
        s = insitu.Session(f"nvme-tcp://{listen}/{nqn}")
        with pytest.raises(Exception) as e:
            s.write(1, physical // 512, b"X" * 512)
        assert "locked" in str(e.value).lower() or "0xc6" in str(e.value).lower()
        out = denv.ok("run", "--rm", env.image, "cat", "/data/shared.txt")
        assert out == "v1\n"
        cli_json("unlock", f)
        f.write_text("v2 from the host\n")
        os.sync()
        out = denv.ok("run", "--rm", env.image, "cat", "/data/shared.txt")
        assert out == "v2 from the host\n"
        # Locks are not persistent: after a target restart the old lock is gone.
        cli_json("lock", f)
        run_cli("target", "stop", "--listen", listen)
        cli_json(*start, timeout=120)
        r = run_cli("unlock", f)
        assert r.rc == 0 and "no longer held" in r.stdout + r.stderr
        f.write_text("v3\n")
    finally:
        run_cli("detach", mnt)
        run_cli("target", "stop", "--listen", listen)


def test_kv_store_is_every_containers_kv(env):
    """The KV store's local API: with --kv-store and --docker every container gets the store
    at /kv (a file per key); what a container writes, the host reads with `insitu kv`, and
    the other way round. A name of more than 16 key bytes fails and stores nothing."""
    d = env.d / "kv"
    d.mkdir()
    ns, kv_priv, priv = d / "ns.img", d / "kv-private.img", d / "private.img"
    # The first private namespace keeps the KV store (and the KV cache in what is left);
    # the last one, as always with --docker, the images and containers.
    for p, size in [(ns, 64 << 20), (kv_priv, 64 << 20), (priv, 256 << 20)]:
        with open(p, "wb") as f:
            f.truncate(size)
    listen, api, nqn = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}", "nqn.2024-01.io.insitu:kv-local"
    cli_json(
        "target",
        "start",
        "--listen",
        listen,
        "--nqn",
        nqn,
        "--namespace",
        ns,
        "--private",
        kv_priv,
        "--private",
        priv,
        "--kv-store",
        "16M",
        "--docker",
        api,
        timeout=120,
    )
    denv = Env(env.d, api, env.registry, env.image, env.data_mnt, listen)
    url = f"nvme-tcp://{listen}/{nqn}"
    mnt = Path("/run/insitu") / f"kv-{listen.replace(':', '_')}"

    def kv(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([INSITU, "kv", *args], capture_output=True, timeout=60)

    try:
        assert os.path.ismount(mnt), f"{mnt} is not mounted"
        out = denv.ok("run", "--rm", env.image, "sh", "-c", "echo -n hello > /kv/greeting; cat /kv/greeting; echo; ls /kv")
        lines = out.split("\n")
        assert lines[0] == "hello" and "greeting" in lines[1:], out
        r = kv("get", url, "greeting")
        assert r.returncode == 0 and r.stdout == b"hello", r.stderr
        assert kv("put", url, "fromhost", "v1").returncode == 0
        assert kv("put", url, "0x00ff", "bin").returncode == 0
        assert denv.ok("run", "--rm", env.image, "cat", "/kv/fromhost") == "v1"
        # Keys that are not plain text are named in hex, as `insitu kv ls` prints them.
        assert denv.ok("run", "--rm", env.image, "ls", "/kv").split() == ["0x00ff", "fromhost", "greeting"]
        assert denv.ok("run", "--rm", env.image, "cat", "/kv/0x00ff") == "bin"
        # 17 bytes: the write fails in the container, nothing is stored.
        r = denv.docker("run", "--rm", env.image, "sh", "-c", "echo x > /kv/seventeen-bytes-x")
        assert r.returncode != 0 and "too long" in r.stderr.lower(), r.stderr
        keys = cli_json("kv", "ls", url)["keys"]
        assert keys == ["0x00ff", "fromhost", "greeting"], keys
        # Overwrite and delete from a container.
        denv.ok("run", "--rm", env.image, "sh", "-c", "echo -n v2 > /kv/fromhost; rm /kv/greeting")
        assert kv("get", url, "fromhost").stdout == b"v2"
        assert kv("exists", url, "greeting").returncode == 1
    finally:
        run_cli("target", "stop", "--listen", listen)
    assert not os.path.ismount(mnt) and not mnt.exists(), "stopping the target unmounts and removes /kv's source"
    # A target without a KV store gives containers no /kv.
    r = env.docker("run", "--rm", env.image, "ls", "/kv")
    assert r.returncode != 0


def test_bench_containers_runs_both_sides_and_they_agree(tmp_path):
    """`insitu bench containers` end to end on small files: its own target, image and
    attachment; it fails if the container's output differs from the host's."""
    if os.geteuid() != 0:
        pytest.skip("containers need root")
    need("docker", "runc", "busybox")
    # A Python subcommand: the package's entry point, whatever binary INSITU_BIN names.
    entry = ROOT / ".venv" / "bin" / "insitu"
    if not entry.exists():
        pytest.skip("the package's insitu entry point is not installed (make build)")
    p = subprocess.run(
        [entry, "bench", "containers", "--size", "8M", "--compute-size", "2M", "--quiet", "--json", "--dir", tmp_path / "work"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert [x["workload"] for x in r["results"]] == ["grep", "sha256"]
    assert all(x["host_s"] > 0 and x["container_s"] > 0 for x in r["results"])
    assert r["device_model"]["name"] == "newport" and r["container_start_s"] > 0
    # 8 MiB of lines, one in 97 with the pattern: grep's count is the same on both sides.
    assert int(r["rows"][0]["output"]) > 1000
    assert not any((tmp_path / "work" / "host").iterdir()), "the host attachment was detached"
