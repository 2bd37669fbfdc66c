# SPDX-License-Identifier: Apache-2.0
"""The supervisor of a single-node Swift cluster: it lives in the cluster's own mount
namespace and is the parent of every server.

Started by ``insitu swift up`` as

    unshare --mount --propagation private /usr/bin/python3 -I _supervisor.py DIR

and run by the system Python with the standard library only. Swift's servers always read
``/etc/swift/swift.conf`` (hash path secrets, storage policies), so each cluster needs its
own view of ``/etc/swift``: in this namespace DIR is bind-mounted over it, and nothing
outside sees the change.

Steps:

1. Lazily unmount, in this namespace only, the loop-backed and FUSE mounts copied from
   the parent namespace other than DIR's devices and the mounts DIR lies on. A copy of a mount pins its file system:
   without this, another namespace detached on the host while the cluster runs would stay
   mounted here, its loop device and FUSE daemon busy.
2. Bind-mount DIR over /etc/swift.
3. Start memcached and the account, container, object and proxy servers (DIR/run/plan.json
   names the ports), each in its own process group with its output in DIR/log/NAME.log,
   and record their pids in DIR/run/supervisor.json.
4. Wait. A server that exits is recorded there (``exited``), not restarted: the cluster is
   for tests, where a silent restart would hide a failure.
5. On SIGTERM or SIGINT, stop every server (SIGTERM to its group, SIGKILL after 10 s) and
   exit; the namespace, and the bind mount with it, goes away with the last process in it.
"""

import json
import os
import signal
import subprocess
import sys
import time

PROGRAMS = {
    "account": "/usr/bin/swift-account-server",
    "container": "/usr/bin/swift-container-server",
    "object": "/usr/bin/swift-object-server",
    "proxy": "/usr/bin/swift-proxy-server",
}

_stop = False


def _on_signal(signum, frame):
    global _stop
    _stop = True


def _log(msg):
    print(time.strftime("%Y-%m-%d %H:%M:%S"), msg, flush=True)


def _write_state(dir, state):
    path = os.path.join(dir, "run", "supervisor.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, path)


def _mounts():
    """(mount point, fstype, source) of this namespace, deepest last."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            point = left.split()[4].replace("\\040", " ")
            fstype, source = right.split()[:2]
            out.append((point, fstype, source))
    return out


def _drop_foreign_mounts(dir):
    ours = os.path.join(dir, "node") + "/"
    for point, fstype, source in reversed(_mounts()):
        if point.startswith(ours) or (dir + "/").startswith(point.rstrip("/") + "/"):
            continue  # a device of ours, or a mount DIR itself lies on
        if fstype.startswith("fuse") or source.startswith("/dev/loop"):
            # MNT_DETACH (umount -l): only this namespace's copy goes.
            r = subprocess.run(["umount", "-l", point], capture_output=True, text=True)
            if r.returncode != 0:
                _log(f"could not drop the copy of {point} ({fstype} {source}): {r.stderr.strip()}")


def _start(dir, name, argv, env):
    log = open(os.path.join(dir, "log", name + ".log"), "ab")
    # Own process group: a server's worker processes stop with it.
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=dir, env=env, process_group=0)
    log.close()
    return p


def _stop_all(procs):
    for name, p in procs.items():
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 10
    for name, p in procs.items():
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _log(f"{name} did not stop in 10 s: killing it")
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def main():
    dir = os.path.abspath(sys.argv[1])
    with open(os.path.join(dir, "run", "plan.json")) as f:
        plan = json.load(f)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": dir}
    state = {"pid": os.getpid(), "mnt_ns": os.readlink("/proc/self/ns/mnt"), "servers": {}, "exited": {}, "ready": False}
    _write_state(dir, state)
    procs = {}
    try:
        _drop_foreign_mounts(dir)
        subprocess.run(["mount", "--bind", dir, "/etc/swift"], check=True, capture_output=True, text=True)
        ports = plan["ports"]
        procs["memcached"] = _start(
            dir, "memcached", ["/usr/bin/memcached", "-l", "127.0.0.1", "-p", str(ports["memcached"]), "-U", "0", "-u", "root", "-m", "64"], env
        )
        for name in ("account", "container", "object", "proxy"):
            conf = os.path.join(dir, name + "-server.conf")
            procs[name] = _start(dir, name + "-server", [PROGRAMS[name], conf, "-v"], env)
        state["servers"] = {n: p.pid for n, p in procs.items()}
        state["ready"] = True
        _write_state(dir, state)
        _log("started " + ", ".join(f"{n} (pid {p.pid})" for n, p in procs.items()))
        while not _stop:
            for name, p in procs.items():
                if name not in state["exited"] and p.poll() is not None:
                    state["exited"][name] = p.returncode
                    _log(f"{name} exited with status {p.returncode}; see log/{name if name == 'memcached' else name + '-server'}.log")
                    _write_state(dir, state)
            time.sleep(0.2)
        _log("stopping")
    except Exception as e:  # noqa: BLE001 - recorded for `up`, which reports it
        state["error"] = f"{type(e).__name__}: {getattr(e, 'stderr', '') or e}"
        _log(state["error"])
        _write_state(dir, state)
    finally:
        _stop_all(procs)
    _log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
