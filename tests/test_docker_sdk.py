# SPDX-License-Identifier: Apache-2.0
"""Containers on a target driven by the Docker SDK for Python, as scripts and CI jobs
drive a Docker host: `containers.run`, inspect fidelity, every create option honoured or
refused by name, kill/stop that return settled, logs on line boundaries (tail, since,
until, timestamps), attach replay to an exited container, load errors in the stream.

The same world as test_containers.py (its `env` fixture: a target with the Docker API on
loopback and a loopback docker-registry holding busybox). Everything talks to 127.0.0.1.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from test_containers import Env, env  # noqa: F401  (env is the module's fixture)

docker = pytest.importorskip("docker", reason="the Docker SDK for Python (make deps installs it)")

# The fields of moby's HostConfig (API 1.47), each with a value other than its default.
HOST_CONFIG_PROBES = {
    "Annotations": {"a": "b"},
    "AutoRemove": True,
    "Binds": ["probe-vol:/probe"],
    "BlkioDeviceReadBps": [{"Path": "/dev/sda", "Rate": 1024}],
    "BlkioDeviceReadIOps": [{"Path": "/dev/sda", "Rate": 10}],
    "BlkioDeviceWriteBps": [{"Path": "/dev/sda", "Rate": 1024}],
    "BlkioDeviceWriteIOps": [{"Path": "/dev/sda", "Rate": 10}],
    "BlkioWeight": 300,
    "BlkioWeightDevice": [{"Path": "/dev/sda", "Weight": 300}],
    "CapAdd": ["SYS_ADMIN"],
    "CapDrop": ["NET_RAW"],
    "Cgroup": "other",
    "CgroupParent": "/elsewhere",
    "CgroupnsMode": "host",
    "ConsoleSize": [30, 100],
    "ContainerIDFile": "/tmp/cid",
    "CpuCount": 2,
    "CpuPercent": 50,
    "CpuPeriod": 50000,
    "CpuQuota": 25000,
    "CpuRealtimePeriod": 1000,
    "CpuRealtimeRuntime": 500,
    "CpuShares": 512,
    "CpusetCpus": "0",
    "CpusetMems": "0",
    "DeviceCgroupRules": ["c 1:3 rwm"],
    "DeviceRequests": [{"Driver": "nvidia", "Count": -1}],
    "Devices": [{"PathOnHost": "/dev/null", "PathInContainer": "/dev/x", "CgroupPermissions": "rwm"}],
    "Dns": ["10.0.0.1"],
    "DnsOptions": ["ndots:2"],
    "DnsSearch": ["example.org"],
    "ExtraHosts": ["h:10.0.0.2"],
    "GroupAdd": ["65534"],
    "IOMaximumBandwidth": 1000,
    "IOMaximumIOps": 10,
    "Init": True,
    "IpcMode": "host",
    "Isolation": "hyperv",
    "Links": ["other:alias"],
    "LogConfig": {"Type": "syslog", "Config": {}},
    "MaskedPaths": ["/proc/x"],
    "Memory": 64 << 20,
    "MemoryReservation": 32 << 20,
    "MemorySwap": 128 << 20,
    "MemorySwappiness": 10,
    "Mounts": [{"Type": "tmpfs", "Target": "/probe-tmp"}],
    "NanoCpus": 500_000_000,
    "NetworkMode": "none",
    "OomKillDisable": True,
    "OomScoreAdj": 100,
    "PidMode": "host",
    "PidsLimit": 50,
    "PortBindings": {"80/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}]},
    "Privileged": True,
    "PublishAllPorts": True,
    "ReadonlyPaths": ["/proc/x"],
    "ReadonlyRootfs": True,
    "RestartPolicy": {"Name": "on-failure", "MaximumRetryCount": 2},
    "Runtime": "kata",
    "SecurityOpt": ["seccomp=unconfined"],
    "ShmSize": 8 << 20,
    "StorageOpt": {"size": "1G"},
    "Sysctls": {"net.ipv4.ip_forward": "1"},
    "Tmpfs": {"/probe-tmpfs": "size=1m"},
    "UTSMode": "host",
    "Ulimits": [{"Name": "nofile", "Soft": 256, "Hard": 512}],
    "UsernsMode": "host",
    "VolumeDriver": "nfs",
    "VolumesFrom": ["other"],
}

# Options a client keeps to itself (the server only records them).
CLIENT_SIDE = {"ContainerIDFile"}


@pytest.fixture(scope="module")
def client(env: Env):
    env.ok("pull", env.image)
    c = docker.DockerClient(base_url=f"tcp://{env.api}", version="auto", timeout=60)
    yield c
    c.close()


def _api(client):
    return client.api


def test_containers_run_returns_the_output_and_removes(client, env: Env):
    out = client.containers.run(env.image, ["sh", "-c", "echo one; echo two >&2; echo three"], remove=True)
    assert out == b"one\nthree\n"
    out = client.containers.run(env.image, ["sh", "-c", "echo out; echo err >&2"], stdout=True, stderr=True, remove=True)
    assert sorted(out.split()) == [b"err", b"out"]
    with pytest.raises(docker.errors.ContainerError) as e:
        client.containers.run(env.image, ["sh", "-c", "echo bad >&2; exit 3"], remove=True)
    assert e.value.exit_status == 3 and b"bad" in e.value.stderr
    names = [c.name for c in client.containers.list(all=True)]
    assert not any(n.startswith("insitu_") for n in names), names


def test_inspect_echoes_what_create_was_given(client, env: Env):
    c = client.containers.create(
        env.image,
        ["sleep", "30"],
        name="sdk-echo",
        hostname="probe-host",
        user="65534",
        environment={"A": "1"},
        labels={"k": "v"},
        cpu_shares=512,
        mem_limit="64m",
        memswap_limit="128m",
        pids_limit=50,
        tmpfs={"/scratch": "size=1m"},
        restart_policy={"Name": "on-failure", "MaximumRetryCount": 2},
        stop_signal="SIGINT",
        working_dir="/tmp",
        cap_drop=["NET_RAW"],
        group_add=["65534"],
        ulimits=[docker.types.Ulimit(name="nofile", soft=256, hard=512)],
    )
    try:
        a = c.attrs
        hc, cfg = a["HostConfig"], a["Config"]
        assert hc["LogConfig"]["Type"] == "json-file"
        assert hc["CpuShares"] == 512 and hc["Memory"] == 64 << 20 and hc["MemorySwap"] == 128 << 20 and hc["PidsLimit"] == 50
        assert hc["Tmpfs"] == {"/scratch": "size=1m"}
        assert hc["RestartPolicy"] == {"Name": "on-failure", "MaximumRetryCount": 2}
        assert hc["CapDrop"] == ["NET_RAW"] and hc["GroupAdd"] == ["65534"]
        assert hc["Ulimits"] == [{"Name": "nofile", "Soft": 256, "Hard": 512}]
        assert cfg["Hostname"] == "probe-host" and cfg["User"] == "65534" and cfg["StopSignal"] == "SIGINT"
        assert "A=1" in cfg["Env"] and cfg["Labels"] == {"k": "v"} and cfg["WorkingDir"] == "/tmp"
        assert cfg["Cmd"] == ["sleep", "30"] and c.labels == {"k": "v"} and c.status == "created"
        # Every HostConfig field of the API is answered.
        assert set(HOST_CONFIG_PROBES) <= set(hc), set(HOST_CONFIG_PROBES) - set(hc)
    finally:
        c.remove(force=True)


def _run_sh(client, env, script, **kw):
    c = client.containers.run(env.image, ["sh", "-c", script], detach=True, **kw)
    try:
        code = c.wait(timeout=60)["StatusCode"]
        return code, c.logs().decode()
    finally:
        c.remove(force=True)


def test_honoured_options_take_effect(client, env: Env):
    code, out = _run_sh(
        client,
        env,
        "id -u; id -G; hostname; ulimit -n; grep ' /scratch ' /proc/mounts; touch /ro-probe 2>&1 || echo readonly",
        user="65534",
        group_add=["65534"],
        hostname="probe-host",
        ulimits=[docker.types.Ulimit(name="nofile", soft=256, hard=512)],
        tmpfs={"/scratch": "size=1m"},
        read_only=True,
    )
    lines = out.splitlines()
    assert code == 0, out
    assert lines[0] == "65534" and "65534" in lines[1].split() and lines[2] == "probe-host" and lines[3] == "256", lines
    assert lines[4].startswith("tmpfs /scratch tmpfs") and lines[-1] == "readonly", lines
    # The cgroup limits, read on the target's side (containers see no cgroupfs).
    c = client.containers.run(env.image, ["sleep", "60"], detach=True, cpu_shares=512, mem_limit="64m", memswap_limit="96m", pids_limit=40)
    try:
        assert _cgroup(c.id, "cpu", "cpu.shares") == "512"
        assert _cgroup(c.id, "memory", "memory.limit_in_bytes") == str(64 << 20)
        assert _cgroup(c.id, "memory", "memory.memsw.limit_in_bytes") in (str(96 << 20), None)
        assert _cgroup(c.id, "pids", "pids.max") == "40"
    finally:
        c.remove(force=True)


def _cgroup(cid: str, controller: str, name: str) -> str | None:
    """A cgroup (v1) file of a container on the target, or None where the kernel has none."""
    p = Path("/sys/fs/cgroup") / controller / "insitu" / cid / name
    if not p.exists():
        v2 = {"cpu.shares": None, "memory.limit_in_bytes": "memory.max", "pids.max": "pids.max"}.get(name)
        p = Path("/sys/fs/cgroup/insitu") / cid / (v2 or name)
        if not v2 or not p.exists():
            return None
    return p.read_text().strip()


def test_every_host_config_field_is_honoured_or_refused_by_name(client, env: Env):
    api = _api(client)
    for field, value in HOST_CONFIG_PROBES.items():
        body = {"Image": env.image, "Cmd": ["true"], "HostConfig": {field: value}}
        r = api._post_json(api._url("/containers/create"), data=body)
        if r.status_code == 201:
            cid = r.json()["Id"]
            try:
                hc = api.inspect_container(cid)["HostConfig"]
                assert hc[field] == value or field == "Mounts", f"{field}: given {value!r}, inspect says {hc[field]!r}"
            finally:
                api.remove_container(cid, force=True)
        else:
            assert field not in CLIENT_SIDE
            assert r.status_code == 400, f"{field}: {r.status_code} {r.text}"
            assert field in r.json()["message"], f"{field}: the refusal does not name it: {r.text}"


def test_restart_policy_restarts_a_failing_container(client, env: Env):
    c = client.containers.run(env.image, ["sh", "-c", "echo run; exit 1"], detach=True, restart_policy={"Name": "on-failure", "MaximumRetryCount": 2})
    try:
        for _ in range(200):
            c.reload()
            if c.attrs["RestartCount"] >= 2 and c.status == "exited":
                break
            time.sleep(0.1)
        assert c.attrs["RestartCount"] == 2 and c.status == "exited", c.attrs["State"]
        assert c.logs().decode().count("run") == 3, (c.logs(timestamps=True), c.attrs["State"])
    finally:
        c.remove(force=True)


def test_kill_and_stop_return_once_settled(client, env: Env):
    for _ in range(4):
        c = client.containers.run(env.image, ["sleep", "300"], detach=True)
        c.kill()
        c.reload()
        assert c.status == "exited" and c.attrs["State"]["Running"] is False
        c.remove()
    c = client.containers.run(env.image, ["sleep", "300"], detach=True, stop_signal="SIGKILL")
    c.stop(timeout=30)
    c.reload()
    assert c.status == "exited" and c.attrs["State"]["ExitCode"] == 137
    c.remove()
    # The stop request's own signal (API 1.42) wins over the container's (TERM, which
    # this one would answer with exit code 3).
    c = client.containers.run(env.image, ["sh", "-c", "trap 'exit 3' TERM; while true; do sleep 0.1; done"], detach=True)
    r = client.api.post(client.api._url("/containers/{0}/stop", c.id), params={"signal": "SIGKILL", "t": 30})
    assert r.status_code == 204
    c.reload()
    assert c.attrs["State"]["ExitCode"] == 137
    c.remove()


def test_logs_on_line_boundaries(client, env: Env):
    c = client.containers.run(env.image, ["sh", "-c", "printf 'a\\nb\\nc\\n'; sleep 2; echo late"], detach=True)
    try:
        c.wait(timeout=60)
        assert c.logs(tail=1) == b"late\n"
        assert c.logs(tail=2) == b"c\nlate\n"
        assert c.logs(tail=0) == b""
        stamped = c.logs(timestamps=True).decode().splitlines()
        times = [datetime.datetime.fromisoformat(s.split(" ", 1)[0][:26] + "+00:00") for s in stamped]
        assert [s.split(" ", 1)[1] for s in stamped] == ["a", "b", "c", "late"]
        assert times == sorted(times)
        cut = times[3] - datetime.timedelta(milliseconds=500)
        assert c.logs(since=cut) == b"late\n"
        assert c.logs(until=cut) == b"a\nb\nc\n"
    finally:
        c.remove(force=True)


def test_attach_replays_the_log_of_an_exited_container_and_closes(client, env: Env):
    c = client.containers.run(env.image, ["sh", "-c", "echo gone"], detach=True)
    try:
        c.wait(timeout=60)
        assert c.attach(logs=True, stream=False) == b"gone\n"
        assert c.attach(logs=False, stream=False) == b""
    finally:
        c.remove(force=True)


def test_load_of_a_non_archive_reports_in_the_stream(client, env: Env):
    with pytest.raises(docker.errors.ImageLoadError) as e:
        client.images.load(b"this is not a tar archive")
    assert "archive" in str(e.value)
    bad = io.BytesIO()
    with tarfile.open(fileobj=bad, mode="w") as t:
        info = tarfile.TarInfo("manifest.json")
        data = json.dumps([{"Config": "../../etc/passwd", "RepoTags": ["x:y"], "Layers": []}]).encode()
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    before = sorted(i.id for i in client.images.list())
    with pytest.raises(docker.errors.ImageLoadError):
        client.images.load(bad.getvalue())
    assert sorted(i.id for i in client.images.list()) == before


def test_exec_runs_in_the_container(client, env: Env):
    c = client.containers.run(env.image, ["sleep", "300"], detach=True, environment={"FROM_RUN": "r"})
    try:
        r = c.exec_run(["sh", "-c", "echo out; echo err >&2; echo $FROM_RUN $X; pwd; exit 4"], environment={"X": "x"}, workdir="/tmp")
        assert r.exit_code == 4
        assert sorted(r.output.decode().split()) == sorted(["out", "err", "r", "x", "/tmp"])
        r = c.exec_run(["sh", "-c", "echo out; echo err >&2"], demux=True)
        assert r.output == (b"out\n", b"err\n")
        r = c.exec_run(["id", "-u"], user="65534")
        assert (r.exit_code, r.output) == (0, b"65534\n")
        # The exec shares the container's pid namespace: it sees sleep as pid 1.
        assert c.exec_run(["cat", "/proc/1/cmdline"]).output.startswith(b"sleep")
        r = c.exec_run(["sh", "-c", "tty; stty size"], tty=True)
        assert r.exit_code == 0 and b"/dev/pts/" in r.output, r.output
        api = _api(client)
        eid = api.exec_create(c.id, ["sh", "-c", "sleep 0.5; exit 7"])["Id"]
        assert api.exec_inspect(eid)["Running"] is False and api.exec_inspect(eid)["ExitCode"] is None
        api.exec_start(eid, detach=True)
        for _ in range(100):
            if not api.exec_inspect(eid)["Running"]:
                break
            time.sleep(0.1)
        info = api.exec_inspect(eid)
        assert info["ExitCode"] == 7 and info["ContainerID"] == c.id and info["ProcessConfig"]["entrypoint"] == "sh"
        assert eid in c.attrs["ExecIDs"] or eid in client.containers.get(c.id).attrs["ExecIDs"]
        with pytest.raises(docker.errors.APIError) as e:
            api.exec_start(eid)
        assert e.value.status_code == 409
        with pytest.raises(docker.errors.NotFound):
            api.exec_inspect("0" * 64)
        # Standard input reaches the process; its end ends the process's input.
        eid = api.exec_create(c.id, ["sh", "-c", "wc -c"], stdin=True)["Id"]
        sock = api.exec_start(eid, socket=True)
        raw = getattr(sock, "_sock", sock)
        raw.sendall(b"12345")
        raw.shutdown(1)
        got = b""
        while True:
            chunk = raw.recv(4096)
            if not chunk:
                break
            got += chunk
        sock.close()
        assert got[8:].strip() == b"5", got
    finally:
        c.remove(force=True)


def test_exec_of_a_stopped_container_is_a_conflict(client, env: Env):
    c = client.containers.create(env.image, ["true"])
    try:
        with pytest.raises(docker.errors.APIError) as e:
            c.exec_run(["true"])
        assert e.value.status_code == 409
    finally:
        c.remove(force=True)


def test_docker_cli_exec(env: Env):
    env.ok("run", "-d", "--name", "cli-exec", env.image, "sleep", "300")
    try:
        assert env.ok("exec", "cli-exec", "sh", "-c", "echo hi; exit 0") == "hi\n"
        p = env.docker("exec", "cli-exec", "sh", "-c", "exit 5")
        assert p.returncode == 5
        assert env.ok("exec", "-i", "cli-exec", "cat", input="piped\n") == "piped\n"
        assert env.ok("exec", "-e", "V=1", "-w", "/etc", "cli-exec", "sh", "-c", "echo $V $(pwd)") == "1 /etc\n"
    finally:
        env.docker("rm", "-f", "cli-exec")


def test_pause_freezes_and_unpause_thaws(client, env: Env):
    c = client.containers.run(env.image, ["sh", "-c", "while true; do date +%s%N > /tmp/t; sleep 0.05; done"], detach=True)
    try:
        c.pause()
        c.reload()
        assert c.status == "paused" and c.attrs["State"]["Paused"] is True
        assert _cgroup(c.id, "freezer", "freezer.state") in ("FROZEN", None)
        with pytest.raises(docker.errors.APIError) as e:
            c.pause()
        assert e.value.status_code == 409
        c.unpause()
        c.reload()
        assert c.status == "running" and c.attrs["State"]["Paused"] is False
        c.pause()
        c.stop(timeout=5)  # a paused container can still be stopped
        c.reload()
        assert c.status == "exited"
    finally:
        c.remove(force=True)


def test_tag_history_and_list_filters(client, env: Env):
    img = client.images.get(env.image)
    assert img.tag("sdk-tagged", "v1") is True
    tagged = client.images.get("sdk-tagged:v1")
    assert tagged.id == img.id and "sdk-tagged:v1" in tagged.tags
    hist = img.history()
    assert hist and hist[0]["Id"] == img.id and all("CreatedBy" in h and "Size" in h for h in hist)
    assert [i.id for i in client.images.list(filters={"reference": "sdk-tagged"})] == [img.id]
    assert client.images.list(filters={"reference": "no-such-image"}) == []
    assert [i["RepoTags"] for i in client.api.images(name="sdk-tagged")] == [["sdk-tagged:v1"]]
    assert img.id not in [i.id for i in client.images.list(filters={"dangling": True})]
    with pytest.raises(docker.errors.APIError) as e:
        client.images.list(filters={"colour": "blue"})
    assert e.value.status_code == 400
    with pytest.raises(docker.errors.APIError) as e:
        img.tag("bad name!", "x")
    assert e.value.status_code == 400
    client.images.remove("sdk-tagged:v1")
    assert client.images.get(env.image).id == img.id


def test_rename_top_stats_and_prune(client, env: Env):
    c = client.containers.run(env.image, ["sleep", "300"], detach=True, name="sdk-before", labels={"prune": "yes"})
    other = client.containers.create(env.image, ["true"], name="sdk-taken")
    done = client.containers.create(env.image, ["true"], labels={"prune": "yes"})
    keep = client.containers.create(env.image, ["true"], labels={"prune": "no"})
    try:
        c.rename("sdk-after")
        assert client.containers.get("sdk-after").id == c.id
        with pytest.raises(docker.errors.NotFound):
            client.containers.get("sdk-before")
        with pytest.raises(docker.errors.APIError) as e:
            c.rename("sdk-taken")
        assert e.value.status_code == 409
        top = c.top()
        assert "PID" in top["Titles"] and any("sleep" in " ".join(p) for p in top["Processes"]), top
        s = c.stats(stream=False)
        assert s["id"] == c.id and s["memory_stats"]["usage"] > 0 and s["pids_stats"]["current"] >= 1
        assert s["cpu_stats"]["cpu_usage"]["total_usage"] >= s["precpu_stats"]["cpu_usage"]["total_usage"]
        one = next(iter(c.stats(stream=True, decode=True)))
        assert one["id"] == c.id
        assert [x.id for x in client.containers.list(filters={"name": "sdk-after"})] == [c.id]
        assert [x.id for x in client.containers.list(all=True, filters={"label": "prune=no"})] == [keep.id]
        assert c.id not in [x.id for x in client.containers.list(filters={"status": "created"})]
        pruned = client.containers.prune(filters={"label": "prune=yes"})
        assert pruned["ContainersDeleted"] == [done.id], pruned
        ids = [x.id for x in client.containers.list(all=True)]
        assert c.id in ids and keep.id in ids and other.id in ids and done.id not in ids
    finally:
        for x in (c, other, keep):
            x.remove(force=True)


def _tar(entries: dict[str, bytes], mode: int = 0o644) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_archive_get_put_and_head(client, env: Env):
    c = client.containers.run(env.image, ["sh", "-c", "echo hello > /tmp/greeting; mkdir -p /tmp/d/e; echo x > /tmp/d/e/f; sleep 300"], detach=True)
    try:
        for _ in range(100):
            if c.exec_run(["test", "-f", "/tmp/d/e/f"]).exit_code == 0:
                break
            time.sleep(0.05)
        stream, stat = c.get_archive("/tmp/greeting")
        assert stat["name"] == "greeting" and stat["size"] == 6
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as t:
            assert t.extractfile("greeting").read() == b"hello\n"
        stream, stat = c.get_archive("/tmp/d")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as t:
            assert t.extractfile("d/e/f").read() == b"x\n"
        assert stat["mode"] & (1 << 31), "a directory's stat says so"
        assert c.put_archive("/tmp", _tar({"new/file.txt": b"put\n"})) is True
        assert c.exec_run(["cat", "/tmp/new/file.txt"]).output == b"put\n"
        with pytest.raises(docker.errors.NotFound):
            c.get_archive("/no/such/path")
        # A tar climbing out of its destination is refused and changes nothing.
        before = c.exec_run(["ls", "/"]).output
        with pytest.raises(docker.errors.APIError) as e:
            c.put_archive("/tmp", _tar({"ok.txt": b"1", "../../escaped": b"2"}))
        assert e.value.status_code == 400 and ".." in str(e.value)
        assert c.exec_run(["ls", "/"]).output == before
        assert c.exec_run(["test", "-e", "/tmp/ok.txt"]).exit_code == 1
        api = _api(client)
        r = api.head(api._url("/containers/{0}/archive", c.id), params={"path": "/tmp/greeting"})
        assert r.status_code == 200 and "X-Docker-Container-Path-Stat" in r.headers
    finally:
        c.remove(force=True)
    # A stopped container's files are reachable too.
    c = client.containers.run(env.image, ["sh", "-c", "echo done > /result"], detach=True)
    try:
        c.wait(timeout=60)
        stream, _ = c.get_archive("/result")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as t:
            assert t.extractfile("result").read() == b"done\n"
    finally:
        c.remove(force=True)


def test_docker_cp_both_ways(env: Env, tmp_path):
    env.ok("run", "-d", "--name", "cli-cp", env.image, "sleep", "300")
    try:
        src = tmp_path / "in.txt"
        src.write_text("from the host\n")
        env.ok("cp", str(src), "cli-cp:/tmp/in.txt")
        assert env.ok("exec", "cli-cp", "cat", "/tmp/in.txt") == "from the host\n"
        env.ok("exec", "cli-cp", "sh", "-c", "mkdir /out && echo a > /out/a && echo b > /out/b")
        env.ok("cp", "cli-cp:/out", str(tmp_path / "out"))
        assert (tmp_path / "out" / "a").read_text() == "a\n" and (tmp_path / "out" / "b").read_text() == "b\n"
    finally:
        env.docker("rm", "-f", "cli-cp")


def test_volumes_create_inspect_list_remove_prune(client, env: Env):
    v = client.volumes.create("sdk-vol", labels={"team": "a"})
    assert v.name == "sdk-vol" and v.attrs["Driver"] == "local" and v.attrs["Labels"] == {"team": "a"}
    assert client.volumes.get("sdk-vol").id == "sdk-vol"
    assert [x.name for x in client.volumes.list(filters={"label": "team=a"})] == ["sdk-vol"]
    client.containers.run(env.image, ["sh", "-c", "echo kept > /v/f"], volumes={"sdk-vol": {"bind": "/v", "mode": "rw"}}, remove=True)
    c = client.containers.create(env.image, ["cat", "/v/f"], volumes=["sdk-vol:/v"])
    try:
        c.start()
        c.wait(timeout=60)
        assert c.logs() == b"kept\n"
        with pytest.raises(docker.errors.APIError) as e:
            v.remove()
        assert e.value.status_code == 409
    finally:
        c.remove(force=True)
    with pytest.raises(docker.errors.APIError) as e:
        client.volumes.create("sdk-vol2", driver="nfs")
    assert e.value.status_code == 400
    with pytest.raises(docker.errors.APIError):
        client.volumes.create("bad/name")
    client.volumes.create("sdk-unused")
    pruned = client.volumes.prune(filters={"all": "true", "label": "team=a"})
    assert pruned["VolumesDeleted"] == ["sdk-vol"]
    client.volumes.get("sdk-unused").remove()
    with pytest.raises(docker.errors.NotFound):
        client.volumes.get("sdk-unused")


def test_volume_prune_takes_unused_anonymous_volumes_only(client, env: Env):
    """As moby's API 1.42 and later: a volume made without a name (by the API, or for a
    container's Config.Volumes) is labelled com.docker.volume.anonymous; prune without
    all=true takes the unused ones of those, and named volumes only with all=true (or an
    older API version); one a container uses stays. Only the local driver is offered."""
    api = client.api
    anon = api.create_volume()["Name"]
    named = api.create_volume("sdk-prune-named")["Name"]
    c = api.create_container(env.image, ["true"], volumes=["/anon-in-use"])
    try:
        used = next(m["Name"] for m in api.inspect_container(c)["Mounts"] if m["Destination"] == "/anon-in-use")
        assert api.inspect_volume(anon)["Labels"] == {"com.docker.volume.anonymous": ""}
        assert api.inspect_volume(used)["Labels"] == {"com.docker.volume.anonymous": ""}
        assert api.inspect_volume(named)["Labels"] in (None, {})
        deleted = api.prune_volumes()["VolumesDeleted"]
        assert anon in deleted and named not in deleted and used not in deleted, deleted
        assert {v["Name"] for v in api.volumes()["Volumes"]} >= {named, used}
        # API 1.41 prunes every unused volume, as Docker's did.
        old = docker.APIClient(base_url=f"tcp://{env.api}", version="1.41")
        try:
            assert named in old.prune_volumes()["VolumesDeleted"]
        finally:
            old.close()
    finally:
        api.remove_container(c, v=True, force=True)
    assert used not in {v["Name"] for v in api.volumes()["Volumes"] or []}
    with pytest.raises(docker.errors.APIError) as e:
        api.create_container(env.image, ["true"], host_config=api.create_host_config(volume_driver="nfs"))
    assert e.value.status_code == 400 and "VolumeDriver" in str(e.value)
    c = api.create_container(env.image, ["true"], host_config=api.create_host_config(volume_driver="local"))
    assert api.inspect_container(c)["HostConfig"]["VolumeDriver"] == "local"
    api.remove_container(c)


def _mixed_calls(api: str, image: str, i: int) -> str:
    """Ten API calls of one client (run = create + start, exec = create + start +
    inspect, ...), from a process of its own; returns the container's id."""
    c = docker.DockerClient(base_url=f"tcp://{api}", version="auto", timeout=60)
    try:
        name = f"conc-{i}"
        ctr = c.containers.run(image, ["sh", "-c", "echo $0; sleep 1", name], detach=True, name=name)
        assert ctr.exec_run(["echo", "x"]).output == b"x\n"
        ctr.reload()
        c.containers.list(all=True, ignore_removed=True)
        c.images.list()
        assert ctr.wait(timeout=60)["StatusCode"] == 0
        assert ctr.logs() == f"{name}\n".encode()
        c.api.inspect_container(ctr.id)
        c.info()
        c.ping()
        ctr.remove(force=True)
        return ctr.id
    finally:
        c.close()


def _target_pid(env: Env) -> int:
    """The target daemon's pid, from its state file (/run/insitu/target-ADDR_PORT.json)."""
    return json.loads(Path(f"/run/insitu/target-{env.target_listen.replace(':', '_')}.json").read_text())["pid"]


def _rss(pid: int) -> int:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(status["VmRSS"].split()[0]) * 1024


def _loops_of(env: Env) -> set[str]:
    """The loop devices backed by this test's files (other programs on the machine may
    attach their own meanwhile)."""
    out = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout
    return {line.split(":", 1)[0] for line in out.splitlines() if str(env.d) in line}


# How much the daemon's resident memory may grow over the 100 calls below: a leak of a
# container's worth of state per call (buffers, logs, pumps) would pass it.
RSS_GROWTH_BOUND = 32 << 20


def test_concurrent_clients_leak_nothing(client, env: Env):
    """100 mixed API calls from 8 clients at once leave no process, mount, cgroup or loop
    device, and the daemon's memory stays flat (after a warm-up round, which fills its
    caches and thread pools, it grows by less than RSS_GROWTH_BOUND)."""
    ids: list[str] = []

    def leftovers(cid: str) -> list[str]:
        """What a removed container left: mounts, processes, cgroups naming its id."""
        left = [line for line in open("/proc/self/mountinfo") if cid in line]
        for pid in os.listdir("/proc"):
            try:
                if pid.isdigit() and cid.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                    left.append(f"process {pid}")
            except OSError:
                pass
        root = Path("/sys/fs/cgroup")
        left += [str(p) for p in root.glob(f"*/insitu/{cid}")] + [str(p) for p in root.glob(f"insitu/{cid}")]
        return left

    pid = _target_pid(env)
    with concurrent.futures.ProcessPoolExecutor(max_workers=8) as pool:
        warm = [f.result() for f in [pool.submit(_mixed_calls, env.api, env.image, 100 + i) for i in range(8)]]
        time.sleep(1)
        rss_before, loops_before = _rss(pid), _loops_of(env)
        ids += [f.result() for f in [pool.submit(_mixed_calls, env.api, env.image, i) for i in range(10)]]
    time.sleep(1)
    rss_after, loops_after = _rss(pid), _loops_of(env)
    print(f"daemon RSS {rss_before / 2**20:.1f} MiB -> {rss_after / 2**20:.1f} MiB; loop devices {sorted(loops_before)} -> {sorted(loops_after)}")
    assert not [x for x in client.containers.list(all=True) if x.name.startswith("conc-")]
    assert len(ids) == 10
    assert {cid[:12]: leftovers(cid) for cid in ids + warm if leftovers(cid)} == {}
    # The view's loop devices are replaced as containers start (each start sees the host's
    # latest data), so their names change; their number must not grow.
    assert len(loops_after) <= len(loops_before), f"new loop devices: {loops_after - loops_before}"
    assert rss_after - rss_before < RSS_GROWTH_BOUND, f"the daemon grew by {(rss_after - rss_before) / 2**20:.1f} MiB"


def test_system_df_and_image_prune(client, env: Env):
    df = client.df()
    assert any(i["Id"] == client.images.get(env.image).id for i in df["Images"])
    assert {"LayersSize", "Containers", "Volumes", "BuildCache"} <= set(df)
    # Nothing untagged here: the prune removes nothing and keeps the image in use.
    pruned = client.images.prune()
    assert not pruned["ImagesDeleted"] and pruned["SpaceReclaimed"] == 0
    with pytest.raises(docker.errors.APIError) as e:
        client.images.prune(filters={"colour": "red"})
    assert e.value.status_code == 400
    client.images.get(env.image)


def test_archive_reaches_volumes_and_changes_list_the_upper_layer(client, env: Env):
    client.volumes.create("sdk-cp-vol")
    c = client.containers.run(
        env.image,
        ["sh", "-c", "echo changed >> /etc/hostname.new; rm /etc/group; sleep 300"],
        detach=True,
        volumes=["sdk-cp-vol:/rw", "sdk-cp-vol:/ro:ro"],
    )
    try:
        data = _tar({"a.txt": b"into the volume\n"})
        info = tarfile.TarInfo("owned.txt")
        info.uid, info.gid, info.size = 1042, 1043, 1
        owned = io.BytesIO()
        with tarfile.open(fileobj=owned, mode="w") as t:
            t.addfile(info, io.BytesIO(b"o"))
        assert c.put_archive("/rw", data) and c.put_archive("/tmp", owned.getvalue())
        assert c.exec_run(["cat", "/ro/a.txt"]).output == b"into the volume\n"
        assert c.exec_run(["stat", "-c", "%u:%g", "/tmp/owned.txt"]).output.strip() == b"1042:1043"
        with pytest.raises(docker.errors.APIError):
            c.put_archive("/ro", data)
        for _ in range(100):
            kinds = {ch["Path"]: ch["Kind"] for ch in c.diff() or []}
            if "/etc/group" in kinds:
                break
            time.sleep(0.05)
        assert kinds["/etc/group"] == 2 and kinds["/etc/hostname.new"] == 1 and kinds["/etc"] == 0, kinds
        assert kinds["/tmp/owned.txt"] == 1
    finally:
        c.remove(force=True)
        client.volumes.get("sdk-cp-vol").remove()


def test_save_and_load_back(client, env: Env):
    img = client.images.get(env.image)
    data = b"".join(img.save(named=True))
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        names = t.getnames()
        manifest = json.loads(t.extractfile("manifest.json").read())
    assert "index.json" in names and "oci-layout" in names
    assert manifest[0]["RepoTags"] == [env.image]
    # Saved by id, as Docker saves it: no tags, loaded back as the image alone.
    with tarfile.open(fileobj=io.BytesIO(b"".join(img.save(named=False)))) as t:
        assert json.loads(t.extractfile("manifest.json").read())[0]["RepoTags"] == []
    # Loaded back under another name after the original is gone.
    holder = client.containers.create(env.image, ["true"])  # keeps the layers in use
    try:
        img.tag("sdk-saved", "v1")
        client.images.remove("sdk-saved:v1")
        loaded = client.images.load(data)
        assert [i.id for i in loaded] == [img.id]
    finally:
        holder.remove(force=True)
    with pytest.raises(docker.errors.NotFound):
        b"".join(client.api.get_image("no-such-image:v9"))
    # docker save through the CLI, read back by docker load.
    out = env.d / "saved.tar"
    env.ok("save", "-o", str(out), env.image)
    assert f"Loaded image: {env.image}" in env.ok("load", "-i", str(out))


def test_events_tell_what_happened(client, env: Env):
    since = time.time()
    c = client.containers.run(env.image, ["sh", "-c", "exit 2"], detach=True, name="sdk-events", labels={"ev": "1"})
    c.wait(timeout=60)
    c.remove()
    until = time.time() + 0.5
    time.sleep(0.6)
    got = list(client.events(since=since, until=until, decode=True, filters={"container": "sdk-events"}))
    actions = [e["Action"] for e in got]
    assert actions == ["create", "start", "die", "destroy"], actions
    die = got[2]
    assert die["Actor"]["Attributes"]["exitCode"] == "2" and die["Actor"]["Attributes"]["ev"] == "1" and die["Type"] == "container"
    assert all(e["Actor"]["ID"] == c.id for e in got)
    assert list(client.events(since=since, until=until, decode=True, filters={"type": "volume", "container": "sdk-events"})) == []


def test_update_changes_limits_and_restart_policy(client, env: Env):
    c = client.containers.run(env.image, ["sleep", "300"], detach=True, mem_limit="32m")
    try:
        c.update(mem_limit="48m", cpu_shares=300, restart_policy={"Name": "on-failure", "MaximumRetryCount": 1})
        c.reload()
        hc = c.attrs["HostConfig"]
        assert hc["Memory"] == 48 << 20 and hc["CpuShares"] == 300
        assert hc["RestartPolicy"] == {"Name": "on-failure", "MaximumRetryCount": 1}
        assert _cgroup(c.id, "memory", "memory.limit_in_bytes") in (str(48 << 20), None)
        assert _cgroup(c.id, "cpu", "cpu.shares") in ("300", None)
        with pytest.raises(docker.errors.APIError) as e:
            c.update(blkio_weight=300)
        assert e.value.status_code == 400 and "BlkioWeight" in str(e.value)
        # The CLI sends every limit, zero where unchanged.
        env.ok("update", "--cpu-shares", "400", c.id)
        c.reload()
        assert c.attrs["HostConfig"]["CpuShares"] == 400 and c.attrs["HostConfig"]["Memory"] == 48 << 20
    finally:
        c.remove(force=True)


def test_export_and_predefined_networks(client, env: Env):
    c = client.containers.run(env.image, ["sh", "-c", "echo mark > /exported"], detach=True)
    try:
        c.wait(timeout=60)
        data = b"".join(c.export())
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            names = {n.lstrip("./") for n in t.getnames()}
            assert "exported" in names and "bin/busybox" in names
    finally:
        c.remove(force=True)
    nets = {n.name: n for n in client.networks.list()}
    assert {"bridge", "host", "none"} <= set(nets)
    assert client.networks.get(nets["host"].id).attrs["Driver"] == "host"
    assert [n.name for n in client.networks.list(names=["bridge"])] == ["bridge"]
    for driver in ("host", "overlay", "macvlan"):
        with pytest.raises(docker.errors.APIError) as e:
            client.networks.create("sdk-bad-driver", driver=driver)
        assert e.value.status_code == 400 and driver in str(e.value)
    with pytest.raises(docker.errors.APIError) as e:
        client.networks.create("bridge")
    assert e.value.status_code == 403
    with pytest.raises(docker.errors.NotFound):
        client.networks.get("sdk-bad-driver")


def test_commit_makes_an_image_of_the_changes(client, env: Env):
    c = client.containers.run(env.image, ["sh", "-c", "echo made > /made; rm /etc/group"], detach=True)
    try:
        c.wait(timeout=60)
        img = c.commit(repository="sdk-committed", tag="v1", changes=["CMD cat /made", "ENV X=1"], conf={"Labels": {"c": "1"}}, author="me", message="why")
        assert img.tags == ["sdk-committed:v1"] and img.labels.get("c") == "1"
        assert img.attrs["Author"] == "me" and img.attrs["Comment"] == "why" and "X=1" in img.attrs["Config"]["Env"]
        assert client.containers.run("sdk-committed:v1", remove=True) == b"made\n"
        out = client.containers.run("sdk-committed:v1", ["sh", "-c", "test -e /etc/group || echo gone"], remove=True)
        assert out == b"gone\n", "a deletion is a whiteout in the new layer"
        with pytest.raises(docker.errors.APIError) as e:
            c.commit(repository="sdk-bad", changes=["RUN true"])
        assert e.value.status_code == 400 and "RUN" in str(e.value)
        assert [i for i in client.images.list(name="sdk-bad")] == []
        # Parent is the container's image, as moby records it; history shows the chain.
        base = client.images.get(env.image)
        assert img.attrs["Parent"] == base.id
        assert client.api.images(name="sdk-committed")[0]["ParentId"] == base.id
        rows = client.api.history(img.id)
        assert rows[0]["Id"] == img.id and rows[0]["Tags"] == ["sdk-committed:v1"]
        assert rows[1]["Id"] == base.id, rows
        # A committed image of a committed image: its parent is the first.
        c2 = client.containers.run("sdk-committed:v1", ["touch", "/second"], detach=True)
        c2.wait(timeout=60)
        img2 = c2.commit(repository="sdk-committed", tag="v2")
        c2.remove()
        assert img2.attrs["Parent"] == img.id and [r["Id"] for r in client.api.history(img2.id)[:3]] == [img2.id, img.id, base.id]
        # The parent of an image cannot be deleted by id while the child is there.
        with pytest.raises(docker.errors.APIError) as e:
            client.api.remove_image(img.id, force=True)
        assert e.value.status_code == 409 and "dependent child images" in str(e.value)
        client.images.remove("sdk-committed:v2")
    finally:
        c.remove(force=True)
    assert "sha256:" in env.ok("commit", "--change", "CMD echo cli", env.ok("create", env.image, "true").strip(), "sdk-cli-committed")
    client.images.remove("sdk-committed:v1")


def test_import_a_root_file_system(client, env: Env):
    # The busybox image's own files, exported, become a one-layer image.
    c = client.containers.create(env.image, ["true"])
    try:
        rootfs = b"".join(c.export())
    finally:
        c.remove(force=True)
    client.api.import_image_from_data(rootfs, repository="sdk-imported", tag="v1", changes=["CMD echo imported", "ENV Y=2"])
    img = client.images.get("sdk-imported:v1")
    assert len(img.attrs["RootFS"]["Layers"]) == 1 and "Y=2" in img.attrs["Config"]["Env"]
    assert client.containers.run("sdk-imported:v1", remove=True) == b"imported\n"
    # An archive that climbs out of its layer is refused and stores nothing.
    bad = _tar({"ok": b"1", "../escape": b"2"})
    out = client.api.import_image_from_data(bad, repository="sdk-bad-import")
    assert "error" in out or "escape" in str(out)
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get("sdk-bad-import")
    with pytest.raises(docker.errors.APIError) as e:
        client.api.import_image_from_url("http://127.0.0.1:1/x.tar", repository="sdk-url")
    assert e.value.status_code == 400
    client.images.remove("sdk-imported:v1")


def test_bad_input_gets_a_clear_error_and_changes_nothing(client, env: Env):
    api = _api(client)
    before = sorted(c.id for c in client.containers.list(all=True))
    vols = sorted(v.name for v in client.volumes.list())
    c = client.containers.run(env.image, ["sleep", "60"], detach=True)
    try:
        for path in ["/containers/create", f"/containers/{c.id}/exec", f"/containers/{c.id}/update", "/volumes/create", f"/commit?container={c.id}"]:
            r = api.post(api._url(path), data=b'{"Image": "x", "Cmd": [', headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and "JSON" in r.json()["message"], (path, r.status_code, r.text)
        r = api.post(api._url("/containers/create"), json={"Image": "no-such-image:never", "Cmd": ["true"]})
        assert r.status_code == 404 and "no-such-image" in r.json()["message"]
        r = api.post(api._url("/containers/create"), json={"Image": env.image, "HostConfig": {"Privileged": True}})
        assert r.status_code == 400 and "Privileged" in r.json()["message"]
        r = api.get(api._url("/containers/json"), params={"filters": "{not json"})
        assert r.status_code == 400
        r = api.get(api._url(f"/containers/{c.id}/logs"), params={"stdout": 1, "since": "yesterday"})
        assert r.status_code == 400 and "since" in r.json()["message"]
    finally:
        c.remove(force=True)
    assert sorted(x.id for x in client.containers.list(all=True)) == before
    assert sorted(v.name for v in client.volumes.list()) == vols


def test_list_filters_by_network_volume_and_ports(client, env: Env):
    a = client.containers.create(env.image, ["true"], network_mode="none", volumes=["sdk-filter-vol:/v"])
    b = client.containers.create(env.image, ["true"], ports={"8080/tcp": None})
    try:
        ids = lambda **f: sorted(x.id for x in client.containers.list(all=True, filters=f))  # noqa: E731
        assert ids(network="none") == [a.id]
        assert ids(volume="sdk-filter-vol") == [a.id] and ids(volume="/v") == [a.id]
        assert ids(expose="8080/tcp") == [b.id] and ids(publish="8080") == [b.id]
        assert set(ids(health="none")) >= {a.id, b.id} and ids(health="healthy") == []
    finally:
        a.remove(force=True)
        b.remove(force=True)
        client.volumes.get("sdk-filter-vol").remove()


# A UDP echo server for the busybox image, whose nc speaks TCP only: answers each
# datagram with "echo:" and the datagram, to the address it came from.
UDP_ECHO_C = r"""
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
int main(int argc, char **argv) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0) return 1;
    for (;;) {
        char buf[2048] = "echo:";
        struct sockaddr_in from;
        socklen_t len = sizeof from;
        ssize_t n = recvfrom(s, buf + 5, sizeof buf - 5, 0, (struct sockaddr *)&from, &len);
        if (n >= 0) sendto(s, buf, n + 5, 0, (struct sockaddr *)&from, len);
    }
}
"""


def _static_binary(tmp_path: Path, source: str, name: str) -> bytes:
    """`source` compiled statically (no library needed in the image), as a tar of /NAME."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("a C compiler (which Rust's builds need anyway) builds the UDP server")
    (tmp_path / f"{name}.c").write_text(source)
    subprocess.run([cc, "-static", "-O2", "-o", tmp_path / name, tmp_path / f"{name}.c"], check=True)
    return _tar({name: (tmp_path / name).read_bytes()}, mode=0o755)


def test_published_udp_and_tcp_ports(client, env: Env, tmp_path):
    """-p PORT/udp is carried as docker-proxy carries it: datagrams in, answers back to
    each client from the published port; TCP and UDP share a host port; inspect, port and
    ps show both; the sockets close with the container."""
    api = client.api
    c = api.create_container(
        env.image,
        ["/udp-echo", "5353"],
        ports=[(5353, "udp"), 5353],
        host_config=api.create_host_config(port_bindings={"5353/udp": ("127.0.0.1", None), "5353/tcp": ("127.0.0.1", None)}),
    )
    try:
        assert api.put_archive(c["Id"], "/", _static_binary(tmp_path, UDP_ECHO_C, "udp-echo"))
        api.start(c["Id"])
        udp = api.port(c["Id"], "5353/udp")
        tcp = api.port(c["Id"], "5353/tcp")
        assert udp[0]["HostIp"] == "127.0.0.1" and tcp[0]["HostIp"] == "127.0.0.1", (udp, tcp)
        port = int(udp[0]["HostPort"])
        doc = api.inspect_container(c["Id"])
        assert set(doc["NetworkSettings"]["Ports"]) == {"5353/udp", "5353/tcp"}
        assert doc["HostConfig"]["PortBindings"]["5353/udp"] == [{"HostIp": "127.0.0.1", "HostPort": ""}]
        assert "5353/udp" in doc["Config"]["ExposedPorts"]
        row = api.containers(filters={"id": c["Id"]})[0]
        assert {(p["PrivatePort"], p["Type"]) for p in row["Ports"]} == {(5353, "udp"), (5353, "tcp")}
        assert [x["Id"] for x in api.containers(filters={"publish": "5353/udp"})] == [c["Id"]]
        # Two clients at once, each answered on its own socket, many datagrams each.
        socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
        try:
            for s in socks:
                s.settimeout(0.5)
            end = time.time() + 20
            while True:  # until the server in the container is up
                socks[0].sendto(b"ping", ("127.0.0.1", port))
                try:
                    if socks[0].recvfrom(2048)[0] == b"echo:ping":
                        break
                except TimeoutError:
                    pass
                assert time.time() < end, "the UDP server never answered through the proxy"
            for i in range(20):
                for k, s in enumerate(socks):
                    s.sendto(f"{k}-{i}".encode(), ("127.0.0.1", port))
                    data, src = s.recvfrom(2048)
                    assert data == f"echo:{k}-{i}".encode() and src == ("127.0.0.1", port)
        finally:
            for s in socks:
                s.close()
        api.stop(c["Id"], timeout=1)
        assert api.port(c["Id"], "5353/udp") in (None, [])
        # Closed with the container: the port can be bound again.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", port))
    finally:
        api.remove_container(c["Id"], force=True)


def test_query_options_are_honoured_or_refused(client, env: Env):
    with pytest.raises(docker.errors.APIError) as e:
        client.containers.create(env.image, ["true"], platform="linux/arm64")
    assert e.value.status_code == 400 and "platform" in str(e.value)
    with pytest.raises(docker.errors.APIError) as e:
        client.images.pull(env.image, platform="linux/s390x")
    assert e.value.status_code == 400
    c = client.containers.create(env.image, ["true"], platform="linux/amd64")
    with pytest.raises(docker.errors.APIError) as e:
        client.api.remove_container(c.id, link=True)
    assert e.value.status_code == 400
    c.remove()


def _netns() -> set[str]:
    return set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()


def test_user_network_reaches_containers_by_name_and_alias(client, env: Env):
    links_before = set(os.listdir("/sys/class/net"))
    net = client.networks.create("sdk-net", labels={"k": "v"}, ipam=docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet="10.77.0.0/24")]))
    alias = {"sdk-net": client.api.create_endpoint_config(aliases=["web-alias"])}
    server = client.containers.run(
        env.image, ["httpd", "-f", "-p", "8080", "-h", "/etc"], detach=True, name="sdk-web", network="sdk-net", networking_config=alias
    )
    idle = client.containers.run(env.image, ["sleep", "300"], detach=True, name="sdk-idle")
    try:
        a = net.attrs
        assert a["Driver"] == "bridge" and a["Labels"] == {"k": "v"} and a["IPAM"]["Config"][0]["Subnet"] == "10.77.0.0/24"
        assert [n.id for n in client.networks.list(filters={"label": "k=v"})] == [net.id]
        assert [n.name for n in client.networks.list(filters={"type": "custom"})] == ["sdk-net"]
        server.reload()
        ip = server.attrs["NetworkSettings"]["Networks"]["sdk-net"]["IPAddress"]
        # The target's hub namespace, and the container's own beside it.
        hub = next(n for n in _netns() if n.endswith("-" + server.id[:12]))[: -len(server.id[:12]) - 1]
        assert hub in _netns()
        assert ip.startswith("10.77.0."), server.attrs["NetworkSettings"]["Networks"]
        # By name and by alias, from a container on the same network.
        out = client.containers.run(
            env.image,
            ["sh", "-c", "wget -q -O- http://sdk-web:8080/passwd | head -1; ping -c1 -W2 web-alias >/dev/null && echo alias-ok"],
            network="sdk-net",
            remove=True,
        )
        lines = out.decode().splitlines()
        assert lines[0].startswith("root:") and lines[-1] == "alias-ok", lines
        # A container on the default network reaches nothing of it until connected.
        code, text = idle.exec_run(["ping", "-c1", "-W1", ip])
        assert code != 0, text
        net.connect(idle, aliases=["idler"])
        net.reload()
        assert set(net.attrs["Containers"]) == {server.id, idle.id}
        code, text = idle.exec_run(["ping", "-c1", "-W2", ip])
        assert code == 0, text
        code, text = server.exec_run(["ping", "-c1", "-W2", "idler"])
        assert code == 0, text
        with pytest.raises(docker.errors.APIError):
            net.connect(idle)
        with pytest.raises(docker.errors.APIError) as e:
            net.remove()
        assert e.value.status_code == 403
        net.disconnect(idle)
        code, text = idle.exec_run(["ping", "-c1", "-W1", ip])
        assert code != 0, text
        code, text = server.exec_run(["ping", "-c1", "-W1", "idler"])
        assert code != 0, text
    finally:
        for c in (server, idle):
            c.remove(force=True)
    # The containers' namespaces went with them; the network's bridge goes with it; the
    # target's own namespace never had a link added.
    assert not [n for n in _netns() if n.endswith((server.id[:12], idle.id[:12]))]
    assert client.networks.prune()["NetworksDeleted"] == ["sdk-net"]
    assert hub not in _netns() and set(os.listdir("/sys/class/net")) == links_before
    with pytest.raises(docker.errors.NotFound):
        client.networks.get("sdk-net")


def _hub_dns_sockets(hub: str, proto: str = "u") -> list[str]:
    """The sockets (UDP, or TCP with proto "t") bound to port 53 in the target's hub namespace."""
    out = subprocess.run(["ip", "netns", "exec", hub, "ss", f"-H{proto}ln", "sport", "= :53"], capture_output=True, text=True)
    return out.stdout.splitlines()


# Asks a DNS server over TCP (RFC 1035 4.2.2: a two-byte length before each message) for
# the A records of argv[2] and prints the response code and the addresses.
_TCP_DNS = r"""
import socket, struct, sys
server, name = sys.argv[1], sys.argv[2]
q = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
s = socket.create_connection((server, 53), timeout=5)
s.sendall(struct.pack(">H", len(q)) + q)
def read(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise SystemExit("closed")
        b += c
    return b
m = read(struct.unpack(">H", read(2))[0])
ident, flags, qd, an = struct.unpack(">HHHH", m[:8])
assert ident == 0x4242
at = len(q)  # the question, echoed
addrs = []
for _ in range(an):
    at += 2 if m[at] & 0xC0 == 0xC0 else m.index(0, at) + 1 - at
    rtype, _, _, rdlen = struct.unpack(">HHIH", m[at : at + 10])
    at += 10
    if rtype == 1:
        addrs.append(socket.inet_ntoa(m[at : at + 4]))
    at += rdlen
print(flags & 0xF, *addrs)
"""


def _dns_over_tcp(netns: str, server: str, name: str) -> str:
    """What a DNS server answers over TCP to a query from network namespace `netns`."""
    out = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", _TCP_DNS, server, name], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_user_network_dns_resolves_names_aliases_and_links(client, env: Env):
    """Containers on a user-defined network ask its DNS server (the gateway's port 53 in
    the target's hub namespace, named by their /etc/resolv.conf): container names,
    aliases, the asker's links and reverse lookups resolve; on an internal network other
    names fail at once (SERVFAIL) instead of leaving the target."""
    net = client.networks.create("sdk-dns", internal=True, ipam=docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet="10.78.0.0/24")]))
    ep = lambda **kw: {"sdk-dns": client.api.create_endpoint_config(**kw)}  # noqa: E731
    a = client.containers.run(env.image, ["sleep", "300"], detach=True, name="sdk-dns-a", network="sdk-dns", networking_config=ep(aliases=["alpha"]))
    b = client.containers.run(env.image, ["sleep", "300"], detach=True, name="sdk-dns-b", network="sdk-dns", networking_config=ep(links=[("sdk-dns-a", "bar")]))
    try:
        a.reload()
        ip_a = a.attrs["NetworkSettings"]["Networks"]["sdk-dns"]["IPAddress"]
        gateway = net.attrs["IPAM"]["Config"][0]["Gateway"]
        code, text = b.exec_run(["cat", "/etc/resolv.conf"])
        assert code == 0 and f"nameserver {gateway}" in text.decode(), text
        # busybox's nslookup asks the server named in resolv.conf, never /etc/hosts.
        for name in ["sdk-dns-a", "alpha", "bar", "ALPHA", a.id[:12]]:
            code, text = b.exec_run(["nslookup", name])
            assert code == 0 and ip_a in text.decode(), (name, text)
        code, text = b.exec_run(["nslookup", ip_a])
        assert code == 0 and "sdk-dns-a" in text.decode(), text
        # Links are the asker's own: a does not know "bar".
        code, text = a.exec_run(["nslookup", "bar"])
        assert code != 0, text
        start = time.time()
        code, text = b.exec_run(["nslookup", "no-such-name.example"])
        assert code != 0 and time.time() - start < 5, text
        hub = next(n for n in _netns() if n.endswith("-" + a.id[:12]))[: -len(a.id[:12]) - 1]
        assert [line for line in _hub_dns_sockets(hub) if f"{gateway}:53" in line], _hub_dns_sockets(hub)
        # The same answers over TCP, asked from b's namespace; unknown names fail at once.
        assert [line for line in _hub_dns_sockets(hub, "t") if f"{gateway}:53" in line], _hub_dns_sockets(hub, "t")
        assert _dns_over_tcp(f"{hub}-{b.id[:12]}", gateway, "alpha") == f"0 {ip_a}"
        assert _dns_over_tcp(f"{hub}-{b.id[:12]}", gateway, "bar") == f"0 {ip_a}"
        assert _dns_over_tcp(f"{hub}-{a.id[:12]}", gateway, "bar") == "2"
    finally:
        for c in (a, b):
            c.remove(force=True)
    net.remove()
    # The server went with the network (and the hub with the last network).
    assert hub not in _netns() or not [line for proto in "ut" for line in _hub_dns_sockets(hub, proto) if f"{gateway}:53" in line]


def test_legacy_links_give_hosts_env_and_a_wire(client, env: Env):
    """--link on the default network, as Docker's default bridge: the linked container must
    run; the linking one reaches it by alias over a wire of its own, finds it in
    /etc/hosts and in ALIAS_* variables; inspect and ps show the link; DELETE ?link=1
    removes it and leaves both containers."""
    api = client.api
    child = api.create_container(env.image, ["httpd", "-f", "-p", "8080", "-h", "/etc"], ports=[8080], environment={"FOO": "1"}, name="sdk-link-db")
    parent = api.create_container(
        env.image,
        ["sh", "-c", "env; cat /etc/hosts; wget -q -O- http://db:8080/passwd | head -1; sleep 300"],
        name="sdk-link-app",
        host_config=api.create_host_config(links={"sdk-link-db": "db"}),
    )
    try:
        # Docker's words when the linked container does not run.
        with pytest.raises(docker.errors.APIError) as e:
            api.start(parent)
        assert e.value.status_code == 409 and "Cannot link to a non running container" in str(e.value)
        api.start(child)
        api.start(parent)
        end = time.time() + 20
        while "root:" not in (logs := api.logs(parent).decode()) and time.time() < end:
            time.sleep(0.2)
        lines = logs.splitlines()
        assert "DB_NAME=/sdk-link-app/db" in lines and "DB_ENV_FOO=1" in lines, logs
        addr = next(x.split("=", 1)[1] for x in lines if x.startswith("DB_PORT_8080_TCP_ADDR="))
        assert f"DB_PORT=tcp://{addr}:8080" in lines and "DB_PORT_8080_TCP_PROTO=tcp" in lines, logs
        assert any(x.startswith(addr) and "db" in x.split() and "sdk-link-db" in x.split() for x in lines), logs
        assert lines[-1].startswith("root:"), logs
        assert api.inspect_container(parent)["HostConfig"]["Links"] == ["/sdk-link-db:/sdk-link-app/db"]
        assert "/sdk-link-app/db" in api.containers(filters={"id": child["Id"]})[0]["Names"]
        # The link goes, the containers stay; the wire and the hosts entry with it.
        api.remove_container("sdk-link-app/db", link=True)
        assert api.inspect_container(parent)["HostConfig"]["Links"] is None
        assert api.containers(filters={"id": child["Id"]})[0]["Names"] == ["/sdk-link-db"]
        out = api.exec_start(api.exec_create(parent, ["sh", "-c", f"grep -w db /etc/hosts; wget -q -T 2 -O- http://{addr}:8080/passwd"])["Id"])
        assert b"root:" not in out and b" db " not in out, out
        with pytest.raises(docker.errors.NotFound):
            api.remove_container("sdk-link-app/db", link=True)
        with pytest.raises(docker.errors.APIError) as e:
            api.create_container(env.image, ["true"], host_config=api.create_host_config(links={"no-such-ctr": "x"}))
        assert e.value.status_code == 400 and "Links" in str(e.value)
    finally:
        for c in (parent, child):
            api.remove_container(c, force=True)


def test_init_runs_as_pid_1_and_uts_host_shares_the_hostname(client, env: Env):
    """Init: Debian's tini-static at /sbin/docker-init is PID 1 with the command as its
    child, so SIGTERM reaches a command that would ignore it as PID 1; UTSMode host: the
    target's hostname. PidMode host is refused (the container could signal the daemon)."""
    api = client.api
    c = api.create_container(
        env.image,
        ["sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline; echo; hostname; exec sleep 300"],
        host_config=api.create_host_config(init=True, uts_mode="host"),
    )
    try:
        hc = api.inspect_container(c)["HostConfig"]
        assert hc["Init"] is True and hc["UTSMode"] == "host"
        api.start(c)
        end = time.time() + 20
        while len(api.logs(c).splitlines()) < 2 and time.time() < end:
            time.sleep(0.1)
        pid1, hostname = api.logs(c).decode().splitlines()[:2]
        assert pid1.startswith("/sbin/docker-init -- sh -c"), pid1
        assert hostname == socket.gethostname()
        # sh as PID 1 would ignore SIGTERM until the 10 s timeout; tini passes it on.
        start = time.time()
        api.stop(c, timeout=10)
        assert time.time() - start < 5 and api.inspect_container(c)["State"]["ExitCode"] == 143
    finally:
        api.remove_container(c, force=True)
    for hc, field in [({"PidMode": "host"}, "PidMode"), ({"Init": "yes"}, "Init"), ({"UTSMode": "other"}, "UTSMode")]:
        r = api._post_json(api._url("/containers/create"), data={"Image": env.image, "Cmd": ["true"], "HostConfig": hc})
        assert r.status_code == 400 and field in r.json()["message"], (hc, r.text)
    r = api._post_json(api._url("/containers/create"), data={"Image": env.image, "Hostname": "h", "HostConfig": {"UTSMode": "host"}})
    assert r.status_code == 400 and "conflicting options" in r.json()["message"], r.text


def test_device_cgroup_rules_reach_the_device_cgroup(client, env: Env):
    """DeviceCgroupRules add allow entries to the container's device cgroup, each access
    bit on its own. runc lets any container make any node (`m`), so the probe is a node of
    major 42 (no driver): without a rule opening it is refused by the cgroup (EPERM); with
    `r` a read reaches the kernel, which has no such device (ENXIO), and a write is still
    refused; with `w` the other way round. A bad rule, or one for block devices, is a 400
    naming it, and nothing is created."""
    api = client.api
    script = "mknod /dev/probe c 42 1; echo read:$(cat /dev/probe 2>&1); echo write:$( (echo x > /dev/probe) 2>&1)"

    def run(rules):
        lines = _run_sh(client, env, script, device_cgroup_rules=rules)[1].splitlines()
        return [x for x in lines if x.startswith("read:")][0], [x for x in lines if x.startswith("write:")][0]

    read, write = run([])
    if "Operation not permitted" not in read:
        pytest.skip(f"the devices cgroup is not enforced here: {read}")
    assert "Operation not permitted" in write, write
    read, write = run(["c 42:* rm"])
    assert "No such device" in read and "Operation not permitted" in write, (read, write)
    read, write = run(["c 42:1 w"])
    assert "Operation not permitted" in read and "No such device" in write, (read, write)
    c = client.containers.create(env.image, ["true"], device_cgroup_rules=["c 42:* rm", "c 1:3 mr"])
    try:
        assert c.attrs["HostConfig"]["DeviceCgroupRules"] == ["c 42:* rm", "c 1:3 mr"]
    finally:
        c.remove(force=True)
    before = len(api.containers(all=True))
    for rule, why in [("c 42:* rwx", "TYPE MAJOR:MINOR ACCESS"), ("b 7:* rwm", "block devices"), ("a *:* rwm", "block devices"), ("c *:* m", "wildcard")]:
        r = api._post_json(api._url("/containers/create"), data={"Image": env.image, "Cmd": ["true"], "HostConfig": {"DeviceCgroupRules": [rule]}})
        assert r.status_code == 400 and rule in r.json()["message"] and why in r.json()["message"], (rule, r.text)
    assert len(api.containers(all=True)) == before


def test_config_mac_address_is_the_user_network_interfaces(client, env: Env):
    """Config.MacAddress (the CLI's --mac-address) sets the MAC of the interface on the
    user-defined network NetworkMode names, as moby from API 1.44; on the default network,
    which gives loopback only, it is refused by name."""
    api = client.api
    mac = "02:42:ac:11:00:0a"
    net = client.networks.create("sdk-mac")
    c = api.create_container(env.image, ["sleep", "300"], mac_address=mac, host_config=api.create_host_config(network_mode="sdk-mac"))
    try:
        api.start(c)
        assert api.inspect_container(c)["NetworkSettings"]["Networks"]["sdk-mac"]["MacAddress"] == mac
        out = api.exec_start(api.exec_create(c, ["cat", "/sys/class/net/eth0/address"])["Id"])
        assert out.decode().strip() == mac
    finally:
        api.remove_container(c, force=True)
        net.remove()
    for bad, why in [("02:42:ac:11:00:0a", "loopback only"), ("zz", "MacAddress")]:
        with pytest.raises(docker.errors.APIError) as e:
            api.create_container(env.image, ["true"], mac_address=bad)
        assert e.value.status_code == 400 and why in str(e.value) and "MacAddress" in str(e.value)


def _ws_frames(sock: socket.socket) -> list[tuple[int, bytes]]:
    """Reads websocket frames (a server's: unmasked) until a close frame or the end;
    (opcode, payload) each."""
    data, frames = b"", []

    def take(n: int) -> bytes:
        nonlocal data
        while len(data) < n:
            chunk = sock.recv(65536)
            if not chunk:
                raise EOFError
            data += chunk
        out, data = data[:n], data[n:]
        return out

    try:
        while True:
            b0, b1 = take(2)
            n = b1 & 0x7F
            if n == 126:
                n = int.from_bytes(take(2), "big")
            elif n == 127:
                n = int.from_bytes(take(8), "big")
            frames.append((b0 & 0x0F, take(n)))
            if b0 & 0x0F == 8:
                return frames
    except EOFError:
        return frames


def test_websocket_attach_carries_the_output(client, env: Env):
    """GET /containers/{id}/attach/ws: RFC 6455's handshake, then the output unframed,
    one binary message per write (text before API 1.42), with logs replayed; a close frame
    at the end of the run. A request that is no websocket handshake gets a 400."""
    import base64
    import hashlib

    api = client.api
    c = api.create_container(env.image, ["sh", "-c", "printf 'one two'; sleep 1; printf ' three' >&2"])
    try:
        host, port = env.api.rsplit(":", 1)
        key = base64.b64encode(os.urandom(16)).decode()
        with socket.create_connection((host, int(port)), timeout=20) as s:
            s.sendall(
                (
                    f"GET /v1.47/containers/{c['Id']}/attach/ws?stream=1&stdout=1&stderr=1&logs=1 HTTP/1.1\r\nHost: x\r\n"
                    f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                ).encode()
            )
            head = b""
            while b"\r\n\r\n" not in head:
                head += s.recv(1)
            lines = head.decode().split("\r\n")
            assert lines[0].startswith("HTTP/1.1 101"), lines
            want = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
            headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:] if ":" in x)}
            assert headers["sec-websocket-accept"] == want and headers["upgrade"].lower() == "websocket", headers
            api.start(c)
            frames = _ws_frames(s)
        assert frames[-1][0] == 8, frames
        assert {op for op, _ in frames[:-1]} == {2}, frames
        assert b"".join(p for _, p in frames[:-1]) == b"one two three"
        status, text = env.request("GET", f"/containers/{c['Id']}/attach/ws?stream=1")
        assert status == 400 and b"websocket handshake" in text, (status, text)
    finally:
        api.remove_container(c, force=True)


def test_link_local_ips_are_more_addresses_of_the_network_interface(client, env: Env):
    """IPAMConfig.LinkLocalIPs (--link-local-ip): each address is added, with a /16 as moby
    adds it, to the container's interface on that network, at start and at connect; two
    containers so addressed reach each other by them. Inspect shows them; an IPv6 one, one
    that is no address, and one on the default network (loopback only) are refused."""
    api = client.api
    net = client.networks.create("sdk-ll", ipam=docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet="10.79.0.0/24")]))
    ep = lambda ips: {"sdk-ll": api.create_endpoint_config(link_local_ips=ips)}  # noqa: E731
    server = client.containers.run(
        env.image, ["httpd", "-f", "-p", "8080", "-h", "/etc"], detach=True, network="sdk-ll", networking_config=ep(["169.254.10.10"])
    )
    other = client.containers.run(env.image, ["sleep", "300"], detach=True, name="sdk-ll-later")
    try:
        server.reload()
        assert server.attrs["NetworkSettings"]["Networks"]["sdk-ll"]["IPAMConfig"] == {"LinkLocalIPs": ["169.254.10.10"]}
        code, out = server.exec_run(["ip", "-4", "-o", "addr", "show"])
        assert code == 0 and "169.254.10.10/16" in out.decode(), out
        # Connected while running: the address comes at once.
        api.connect_container_to_network(other.id, "sdk-ll", link_local_ips=["169.254.10.11"])
        code, out = other.exec_run(["ip", "-4", "-o", "addr", "show"])
        assert code == 0 and "169.254.10.11/16" in out.decode(), out
        code, out = other.exec_run(["timeout", "10", "wget", "-q", "-O-", "http://169.254.10.10:8080/passwd"])
        assert code == 0 and b"root:" in out, out
        other.reload()
        assert other.attrs["NetworkSettings"]["Networks"]["sdk-ll"]["IPAMConfig"] == {"LinkLocalIPs": ["169.254.10.11"]}
        for ips, says in [(["fe80::1"], "IPv4 addresses only"), (["baz"], "invalid link-local IP address: baz")]:
            with pytest.raises(docker.errors.APIError) as e:
                client.containers.create(env.image, ["true"], network="sdk-ll", networking_config=ep(ips))
            assert e.value.status_code == 400 and "LinkLocalIPs" in str(e.value) and says in str(e.value), str(e.value)
        body = {"Image": env.image, "Cmd": ["true"], "NetworkingConfig": {"EndpointsConfig": {"bridge": {"IPAMConfig": {"LinkLocalIPs": ["169.254.1.1"]}}}}}
        r = api._post_json(api._url("/containers/create"), data=body)
        assert r.status_code == 400 and "LinkLocalIPs" in r.json()["message"], r.text
    finally:
        for c in (server, other):
            c.remove(force=True)
        net.remove()


def test_network_requests_are_checked(client, env: Env):
    with pytest.raises(docker.errors.APIError) as e:
        client.networks.create("sdk-v6", enable_ipv6=True)
    assert e.value.status_code == 400 and "EnableIPv6" in str(e.value)
    with pytest.raises(docker.errors.APIError) as e:
        client.networks.create("sdk-sub", ipam=docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet="10.78.0.0/33")]))
    assert e.value.status_code == 400 and "10.78.0.0/33" in str(e.value)
    net = client.networks.create("sdk-dup")
    try:
        with pytest.raises(docker.errors.APIError) as e:
            client.networks.create("sdk-dup")
        assert e.value.status_code == 409
        with pytest.raises(docker.errors.NotFound):
            client.containers.create(env.image, ["true"], network="sdk-missing")
        for hc in ({"NetworkMode": "host"}, {"NetworkMode": "none"}):
            c = client.api.create_container(env.image, ["sleep", "30"], host_config=client.api.create_host_config(network_mode=hc["NetworkMode"]))
            try:
                with pytest.raises(docker.errors.APIError) as e:
                    net.connect(c["Id"])
                assert e.value.status_code == 400 and hc["NetworkMode"] in str(e.value)
            finally:
                client.api.remove_container(c["Id"], force=True)
        bad = client.api._post_json(
            client.api._url("/networks/{0}/connect", net.id), data={"Container": "x", "EndpointConfig": {"IPAMConfig": {"IPv6Address": "2001:db8::5"}}}
        )
        assert bad.status_code == 400 and "IPv6Address" in bad.text
    finally:
        net.remove()
    assert "sdk-dup" not in [n.name for n in client.networks.list()]


def test_health_checks_run_and_report(client, env: Env):
    second = 1_000_000_000
    ok = client.containers.run(env.image, ["sleep", "60"], detach=True, healthcheck={"test": ["CMD", "true"], "interval": second, "retries": 1})
    bad = client.containers.run(env.image, ["sleep", "60"], detach=True, healthcheck={"test": "exit 3", "interval": second, "retries": 2})
    try:
        assert ok.attrs["Config"]["Healthcheck"]["Test"] == ["CMD", "true"]
        assert bad.attrs["Config"]["Healthcheck"]["Test"] == ["CMD-SHELL", "exit 3"]
        deadline = time.time() + 30
        while time.time() < deadline:
            ok.reload(), bad.reload()
            if ok.attrs["State"]["Health"]["Status"] == "healthy" and bad.attrs["State"]["Health"]["Status"] == "unhealthy":
                break
            time.sleep(0.3)
        assert ok.attrs["State"]["Health"]["Status"] == "healthy", ok.attrs["State"]
        h = bad.attrs["State"]["Health"]
        assert h["Status"] == "unhealthy" and h["FailingStreak"] >= 2 and h["Log"][-1]["ExitCode"] == 3, h
        assert [c.id for c in client.containers.list(filters={"health": "unhealthy"})] == [bad.id]
        assert "(healthy)" in client.api.containers(filters={"id": ok.id})[0]["Status"]
    finally:
        ok.remove(force=True)
        bad.remove(force=True)
    with pytest.raises(docker.errors.APIError) as e:
        client.containers.create(env.image, ["true"], healthcheck={"test": ["BOGUS"]})
    assert e.value.status_code == 400 and "Healthcheck" in str(e.value)


def test_anonymous_volumes_are_made_and_removed_with_the_container(client, env: Env):
    c = client.api.create_container(env.image, ["sh", "-c", "echo kept > /anon/f"], volumes=["/anon"])
    client.api.start(c["Id"])
    assert client.api.wait(c["Id"], timeout=60)["StatusCode"] == 0
    mounts = client.api.inspect_container(c["Id"])["Mounts"]
    names = [m["Name"] for m in mounts if m["Destination"] == "/anon"]
    assert len(names) == 1 and client.volumes.get(names[0])
    # Copying into it reaches the volume.
    assert client.api.get_archive(c["Id"], "/anon/f")[1]["size"] == 5
    # Another container binds the same volumes with VolumesFrom (read-only when asked).
    out = client.containers.run(env.image, ["sh", "-c", "cat /anon/f; touch /anon/g 2>/dev/null || echo ro"], volumes_from=[f"{c['Id']}:ro"], remove=True)
    assert out.split() == [b"kept", b"ro"]
    client.api.remove_container(c["Id"], v=True)
    with pytest.raises(docker.errors.NotFound):
        client.volumes.get(names[0])
    with pytest.raises(docker.errors.APIError) as e:
        client.api.create_container(env.image, ["true"], volumes=["rel/path"])
    assert e.value.status_code == 400 and "rel/path" in str(e.value)


def test_exec_framing_follows_start_and_missing_commands_exit_127(client, env: Env):
    c = client.containers.run(env.image, ["sleep", "60"], detach=True)
    try:
        # A terminal at create, a multiplexed stream at start: the output comes framed.
        e = client.api.exec_create(c.id, ["echo", "framed"], tty=True)
        out = client.api.exec_start(e["Id"], tty=False, demux=True)
        assert out[0].strip() == b"framed", out
        code, _ = c.exec_run(["no-such-command"])
        assert code == 127
    finally:
        c.remove(force=True)


def test_lifecycle_edges_answer_as_docker(client, env: Env):
    # A container its restart policy starts again cannot be removed without force.
    c = client.api.create_container(env.image, ["sleep", "1"], host_config=client.api.create_host_config(restart_policy={"Name": "always"}))
    client.api.start(c["Id"])
    client.api.wait(c["Id"], timeout=60)
    with pytest.raises(docker.errors.APIError) as e:
        client.api.remove_container(c["Id"])
    assert e.value.status_code == 409 and "stop the container before" in str(e.value)
    client.api.remove_container(c["Id"], force=True)
    # Committing a container whose process has just ended needs no pause.
    c = client.containers.run(env.image, ["touch", "/committed"], detach=True)
    try:
        img = c.commit(repository="sdk-committed")
        assert img.id
    finally:
        c.remove(force=True)
        client.images.remove("sdk-committed")
    # The none log driver keeps nothing, and says so; an unknown driver is named.
    assert client.containers.run(env.image, ["echo", "hi"], log_config={"type": "none"}, remove=True) is None
    c = client.containers.run(env.image, ["echo", "hi"], log_config={"type": "none"}, detach=True)
    try:
        c.wait(timeout=60)
        with pytest.raises(docker.errors.APIError) as e:
            c.logs()
        assert e.value.status_code == 501 and "none" in str(e.value)
    finally:
        c.remove(force=True)
    with pytest.raises(docker.errors.APIError) as e:
        client.containers.create(env.image, ["true"], log_config={"type": "asdf"})
    assert e.value.status_code == 400 and "asdf" in str(e.value)
    # max-size and max-file bound the log as Docker's rotation does: the newest lines stay.
    rotated = docker.types.LogConfig(type="json-file", config={"max-size": "1k", "max-file": "2"})
    c = client.containers.run(env.image, ["sh", "-c", "i=0; while [ $i -lt 500 ]; do echo line $i; i=$((i+1)); done"], log_config=rotated, detach=True)
    try:
        c.wait(timeout=60)
        assert c.attrs["HostConfig"]["LogConfig"] == {"Type": "json-file", "Config": {"max-size": "1k", "max-file": "2"}}
        logs = c.logs()
        assert 0 < len(logs) <= 2048 and logs.endswith(b"line 499\n") and b"line 0\n" not in logs, len(logs)
    finally:
        c.remove(force=True)
    for bad in ({"compress": "true"}, {"max-size": "lots"}):
        with pytest.raises(docker.errors.APIError) as e:
            client.containers.create(env.image, ["true"], log_config=docker.types.LogConfig(type="json-file", config=bad))
        assert e.value.status_code == 400 and next(iter(bad)) in str(e.value)
    # Swarm endpoints answer as a Docker host outside a swarm.
    assert client.api.leave_swarm(force=True) is True
    with pytest.raises(docker.errors.APIError) as e:
        client.api.services()
    assert e.value.status_code == 503
