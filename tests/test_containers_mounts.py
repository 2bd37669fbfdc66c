# SPDX-License-Identifier: Apache-2.0
"""A long-lived container target keeps a bounded number of mounts and loop devices.

Each container start refreshes the read-only view of the sharable namespace (a fresh mount
through a loop device of its own). Those refreshes must replace the view, not stack on it,
and `insitu target stop` must leave nothing mounted or attached, even with a container
still running.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from helpers import cli_json, free_port, run_cli
from test_containers import Env, busybox_registry, need


def mounts_under(prefix: str) -> list[str]:
    """Mount points (this mount namespace) at or below `prefix`."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split(" ")[4] for line in f]
    return [p for p in points if p == prefix or p.startswith(prefix + "/")]


def loops_of(directory: Path) -> list[str]:
    """Loop devices whose backing file is inside `directory`."""
    out = subprocess.run(["losetup", "-l", "-n", "-O", "NAME,BACK-FILE"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if len(line.split()) > 1 and line.split()[1].startswith(str(directory))]


def state_dir(api: str) -> str:
    return "/run/insitu/isp-" + api.replace(":", "_")


@contextlib.contextmanager
def container_target(d: Path, registry: str, image: str):
    """A target with the Docker API on a small sharable namespace (ext4) and a private one;
    yields the docker CLI's environment for it (`Env`)."""
    ns = d / "ns.img"
    cli_json("image", "create", ns, "--size", "64M", "--fs", "ext4")
    priv = d / "private.img"
    with open(priv, "wb") as f:
        f.truncate(512 << 20)
    listen, api = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    cli_json("target", "start", "--listen", listen, "--nqn", "nqn.2024-01.io.insitu:mounts", "--namespace", ns, "--private", priv, "--docker", api, timeout=120)
    (d / "docker-config").mkdir(exist_ok=True)
    try:
        yield Env(d, api, registry, image, d / "mnt", listen)
    finally:
        run_cli("target", "stop", "--listen", listen)


@pytest.fixture(scope="module")
def setup():
    if os.geteuid() != 0:
        pytest.skip("containers need root (runc, overlayfs, loop devices)")
    need("docker", "runc", "docker-registry", "skopeo", "umoci", "losetup")
    d = Path(tempfile.mkdtemp(prefix="insitu-mounts-", dir="/var/tmp"))
    try:
        with busybox_registry(d) as (registry, image):
            yield d, registry, image
    finally:
        shutil.rmtree(d, ignore_errors=True)


def last_line(env: Env, name: str) -> str:
    lines = env.ok("logs", name).splitlines()
    return lines[-1] if lines else ""


def wait_for(what, deadline_s: float = 20):
    end = time.monotonic() + deadline_s
    while not what() and time.monotonic() < end:
        time.sleep(0.2)
    return what()


def test_a_hundred_container_runs_keep_mounts_and_loop_devices_flat(setup):
    d, registry, image = setup
    t = d / "flat"
    t.mkdir()
    with container_target(t, registry, image) as env:
        api, listen, mnt = env.api, env.target_listen, env.data_mnt
        # The host writes the sharable namespace's file system, attached over the fabric.
        cli_json("attach", f"nvme-tcp://{listen}/nqn.2024-01.io.insitu:mounts/1", mnt, timeout=120)
        try:
            (mnt / "marker").write_text("v1\n")
            os.sync()
            env.ok("pull", image)
            # A container that runs through all of it: its /data must follow the refreshes.
            env.ok("run", "-d", "--name", "beside", image, "sh", "-c", "while true; do cat /data/marker; sleep 0.2; done")
            assert wait_for(lambda: last_line(env, "beside") == "v1")
            mounts = loops = -1
            for i in range(100):
                if i == 1:  # after the first run: one layer for `beside`, one for the rest
                    mounts, loops = len(mounts_under(state_dir(api))), len(loops_of(t))
                if i == 50:
                    (mnt / "marker").write_text("v2\n")
                    os.sync()
                out = env.ok("run", "--rm", image, "cat", "/data/marker")
                assert out == ("v1\n" if i < 50 else "v2\n"), (i, out)
            assert len(mounts_under(state_dir(api))) == mounts, mounts_under(state_dir(api))
            assert len(loops_of(t)) == loops, loops_of(t)
            # The refreshes replaced the view beneath the running container's copy too.
            assert wait_for(lambda: last_line(env, "beside") == "v2"), last_line(env, "beside")
            env.ok("rm", "-f", "beside")
        finally:
            run_cli("detach", mnt)
    assert mounts_under(state_dir(api)) == []
    assert loops_of(t) == []


def test_stop_with_a_running_container_leaves_nothing_mounted_or_attached(setup):
    d, registry, image = setup
    t = d / "stop"
    t.mkdir()
    with container_target(t, registry, image) as env:
        api = env.api
        env.ok("pull", image)
        for _ in range(5):
            env.ok("run", "--rm", image, "true")
        env.ok("run", "-d", image, "sleep", "600")
        assert mounts_under(state_dir(api)), "the running target has its view mounted"
    # Stopped (by the context manager) with the container still running.
    assert mounts_under(state_dir(api)) == []
    assert loops_of(t) == []
    leftover = subprocess.run(["pgrep", "-f", "sleep 600"], capture_output=True, text=True).stdout.split()
    assert leftover == [], f"container processes outlived their target: {leftover}"
