# SPDX-License-Identifier: Apache-2.0
"""``insitu bench containers``: a program run in a container on the target, next to its
data, vs the same program on the host reading the same files over the fabric (DockerSSD's
comparison).

One target daemon with the device model on (flash and host link paced for the host's
reads; a container's reads of ``/data`` throttled by its cgroup to the drive's internal
read rate, its CPU to the drive's cores). The host mounts the sharable namespace with
``insitu attach``. Each workload runs on both sides with cold caches, and the outputs
must agree byte for byte:

* ``grep``: GNU grep counting matching lines of a text file (I/O-heavy);
* ``sha256``: busybox sha256sum of a smaller file (compute-heavy).

The image is built here, offline: Debian's busybox-static plus GNU grep and the libraries
it links, loaded with ``docker load``. Needs root, runc and the docker CLI. Everything
talks to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from ._units import parse_size

NQN = "nqn.2024-01.io.insitu:bench-containers"
IMAGE = "insitu-bench/tools:latest"
PATTERN = "ERROR"


def _insitu(*args: str, timeout: float = 600) -> str:
    p = subprocess.run([sys.executable, "-m", "insitu", *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"insitu {' '.join(map(str, args))}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _add(tar: tarfile.TarFile, name: str, data: bytes | None = None, *, mode: int = 0o755, link: str | None = None) -> None:
    info = tarfile.TarInfo(name)
    info.mode, info.mtime = mode, 0
    if link is not None:
        info.type, info.linkname = tarfile.SYMTYPE, link
        tar.addfile(info)
    elif data is None:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _shared_libs(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
        if path.startswith("/"):
            libs.append(path)
    return libs


def image_archive(path: Path) -> None:
    """Writes a `docker save` archive of IMAGE: busybox-static and GNU grep with its libraries."""
    busybox = shutil.which("busybox") or "/bin/busybox"
    grep = shutil.which("grep") or "/usr/bin/grep"
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as t:
        for d in [
            "bin",
            "etc",
            "tmp",
            "data",
            "proc",
            "sys",
            "dev",
            "usr",
            "usr/bin",
            "lib",
            "lib64",
            "usr/lib",
            "usr/lib/x86_64-linux-gnu",
            "lib/x86_64-linux-gnu",
        ]:
            _add(t, d, mode=0o1777 if d == "tmp" else 0o755)
        _add(t, "bin/busybox", Path(busybox).read_bytes())
        applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
        for a in applets:
            if a not in ("busybox", "grep"):
                _add(t, f"bin/{a}", link="busybox")
        _add(t, "bin/grep", Path(grep).read_bytes())
        for lib in _shared_libs(grep):
            real = os.path.realpath(lib)
            _add(t, lib.lstrip("/"), Path(real).read_bytes())
        _add(t, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", mode=0o644)
    blob = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(blob).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Cmd": ["sh"], "Env": ["PATH=/bin:/usr/bin"], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    ).encode()
    cfg_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": cfg_name, "RepoTags": [IMAGE], "Layers": ["layer/layer.tar"]}]).encode()
    with tarfile.open(path, "w") as t:
        _add(t, "layer", mode=0o755)
        _add(t, "layer/layer.tar", blob, mode=0o644)
        _add(t, cfg_name, config, mode=0o644)
        _add(t, "manifest.json", manifest, mode=0o644)


def write_text(path: Path, size: int) -> None:
    """`size` bytes of log-like lines; one in 97 holds PATTERN."""
    lines, n = [], 0
    for i in range(97 * 64):
        lines.append(f"2026-11-25T00:00:{i % 60:02d} node-{i % 13} request {i} took {i * 7919 % 1000} ms status {PATTERN if i % 97 == 0 else 'ok'}\n")
    block = "".join(lines).encode()
    with open(path, "wb") as f:
        while n < size:
            chunk = block[: size - n]
            f.write(chunk)
            n += len(chunk)


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, str]:
    drop_caches()
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    secs = time.perf_counter() - t0
    if p.returncode not in (0, 1):  # grep -c exits 1 when it counts 0
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()}")
    return secs, p.stdout.strip()


def run(args: argparse.Namespace) -> dict:
    if os.geteuid() != 0:
        raise SystemExit("insitu bench containers: needs root (runc, overlayfs, loop devices, dropping caches)")
    docker = shutil.which("docker")
    if not docker or not shutil.which("runc"):
        raise SystemExit("insitu bench containers: needs the docker CLI and runc (make deps installs them)")
    size, csize = parse_size(args.size), parse_size(args.compute_size)
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="insitu-bench-containers-", dir="/var/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    ns, priv, mnt, host = base / "ns.img", base / "private.img", base / "fill", base / "host"
    listen, api = f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"
    env = {**os.environ, "DOCKER_HOST": f"tcp://{api}", "DOCKER_CONFIG": str(base / "docker-config")}
    started = attached = False
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if not args.quiet else (lambda m: None)
    try:
        say(f"writing {size >> 20} MiB + {csize >> 20} MiB of data to an ext4 namespace")
        _insitu("image", "create", ns, "--size", f"{(size + csize) * 5 // 4 + (256 << 20) >> 20}M", "--fs", "ext4")
        _insitu("image", "mount", ns, mnt)
        try:
            write_text(mnt / "logs.txt", size)
            write_text(mnt / "small.txt", csize)
        finally:
            os.sync()
            _insitu("image", "umount", mnt)
        with open(priv, "wb") as f:
            f.truncate(2 << 30)
        say(f"starting a target with device model {args.model} and the Docker API on {api}")
        _insitu("target", "start", "--listen", listen, "--nqn", NQN, "--namespace", ns, "--private", priv, "--docker", api, "--model", args.model)
        started = True
        (base / "docker-config").mkdir(exist_ok=True)
        archive = base / "image.tar"
        image_archive(archive)
        subprocess.run([docker, "load", "-i", str(archive)], env=env, check=True, capture_output=True, timeout=300)
        _insitu("attach", f"nvme-tcp://{listen}/{NQN}", host)
        attached = True
        workloads = {
            "grep": (["grep", "-c", PATTERN], "logs.txt", size),
            "sha256": (["sha256sum"], "small.txt", csize),
        }
        rows = []
        start_s = min(timed([docker, "run", "--rm", IMAGE, "true"], env)[0] for _ in range(3))
        for name, (prog, file, nbytes) in workloads.items():
            for _ in range(args.repeat):
                hprog = prog if prog[0] == "grep" else [shutil.which("busybox") or "busybox", *prog]
                hs, hout = timed([*hprog, str(host / file)])
                cs, cout = timed([docker, "run", "--rm", IMAGE, *prog, f"/data/{file}"], env)
                hval, cval = hout.split()[0], cout.split()[0]
                if hval != cval:
                    raise RuntimeError(f"{name}: the container printed {cval!r}, the host {hval!r}")
                rows.append(
                    {
                        "workload": name,
                        "bytes": nbytes,
                        "host_s": hs,
                        "container_s": cs,
                        "output": hval,
                        "host_mb_s": nbytes / hs / 1e6,
                        "container_mb_s": nbytes / cs / 1e6,
                        "container_vs_host": hs / cs,
                    }
                )
                say(f"{name}: host {hs:.2f} s, container {cs:.2f} s ({hs / cs:.2f}x)")
        model = json.loads(_insitu("model", "show", args.model, "--json"))
        results = []
        for name in workloads:
            mine = [r for r in rows if r["workload"] == name]
            med = lambda k: sorted(r[k] for r in mine)[len(mine) // 2]
            hs, cs, nbytes = med("host_s"), med("container_s"), mine[0]["bytes"]
            results.append(
                {
                    "workload": name,
                    "host_s": hs,
                    "container_s": cs,
                    "host_mb_s": nbytes / hs / 1e6,
                    "container_mb_s": nbytes / cs / 1e6,
                    "container_vs_host": hs / cs,
                }
            )
        return {
            "command": "insitu bench containers " + " ".join(sys.argv[3:] if sys.argv[1:3] == ["bench", "containers"] else []),
            "device_model": model,
            "size_bytes": size,
            "compute_size_bytes": csize,
            "repeat": args.repeat,
            "container_start_s": start_s,
            "rows": rows,
            "results": results,
            "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
        }
    finally:
        if attached:
            subprocess.run([sys.executable, "-m", "insitu", "detach", str(host)], capture_output=True)
        if started:
            subprocess.run([sys.executable, "-m", "insitu", "target", "stop", "--listen", listen], capture_output=True)
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="insitu bench containers", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="newport", help="device model of the target (default newport: 4 Cortex-A53 cores, 1.4 GB/s to its engine, PCIe Gen3 x4)")
    p.add_argument("--size", default="1G", help="text file grep scans (default 1G)")
    p.add_argument("--compute-size", default="128M", help="file sha256sum hashes (default 128M)")
    p.add_argument("--repeat", type=int, default=1, help="runs of each workload on each side; medians are reported (default 1)")
    p.add_argument("--dir", help="work directory, kept afterwards (default: a new one under /var/tmp, removed)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = p.parse_args(argv)
    r = run(args)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print(f"container start: {r['container_start_s']:.2f} s")
        for x in r["results"]:
            print(f"{x['workload']}: host {x['host_mb_s']:.0f} MB/s, container {x['container_mb_s']:.0f} MB/s, container/host {x['container_vs_host']:.2f}x")
    return 0
