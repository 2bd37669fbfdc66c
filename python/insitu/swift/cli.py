# SPDX-License-Identifier: Apache-2.0
"""``insitu swift up|down|status|once``: the command line of :mod:`insitu.swift.cluster`.

:func:`main` takes the words after ``swift``. Exit codes: 0 done, 1 a check found a problem
(``status``, ``down`` with leftovers, ``once`` whose daemon failed), 2 an error or bad
usage (the message says what to change; with ``--json`` it is also printed as
``{"error": ...}``), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, NoReturn

from ._host import ClusterError
from .cluster import DAEMONS, DEFAULT_SIZE, _emit, _load, down, once, public, status, up

__all__ = ["main", "parser"]


class _Parser(argparse.ArgumentParser):
    """Raises on bad usage instead of exiting, so usage errors print like every other
    error (and as ``{"error": ...}`` with --json)."""

    def error(self, message: str) -> NoReturn:
        raise ClusterError(f"{message} (see `{self.prog} --help`)")


HELP = """\
A single-node OpenStack Swift cluster on insitu targets, for tests, demos and first tries.

Each device is an XFS file system on an insitu namespace, mounted at DIR/node/dN: with
target URLs, one device per URL (formatted on the first `up`: this erases the namespace);
without, an embedded target per device over a sparse image in DIR/images. Policy "ec"
(erasure-coded, K data + M parity fragments, each on its own device) is the default for
new containers; policy "replicated" (one replica) is there too. Swift's servers and
memcached listen on 127.0.0.1 only, in a private mount namespace where DIR is mounted
over /etc/swift; the real /etc/swift is never changed.

DIR holds swift.conf, the rings (--swift-dir DIR for Swift's tools), the servers'
configuration, node/ (the devices' mount points), images/, log/ and swift.json (the
state). `down` keeps all of it: `up DIR` again brings back the same cluster with its
objects; remove DIR (after `down`) for a fresh one. Needs root and Debian's swift,
swift-{proxy,account,container,object}, memcached, python3-pyeclib and xfsprogs.
"""


def parser() -> argparse.ArgumentParser:
    """The ``insitu swift`` parser (its subcommands' parsers: :func:`_parsers`)."""
    return _parsers()[0]


def _parsers():
    p = _Parser(prog="insitu swift", description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="{up,down,status,once}", parser_class=_Parser)
    sub.required = True

    def json_flag(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--json", action="store_true", help='print a JSON document on stdout (errors as {"error": ...})')

    u = sub.add_parser(
        "up",
        help="make (or bring back) a cluster in DIR and start it",
        description="Attach the devices, write swift.conf, rings and server configuration into DIR, and "
        "start memcached and the proxy, account, container and object servers on 127.0.0.1. "
        "Prints proxy, auth (tempauth v1.0 URL), user, key, storage_url, policy, ports and "
        "devices (name -> {mount, target}). On failure everything started is stopped again.",
    )
    u.add_argument("dir", metavar="DIR", help="the cluster's directory (created if missing; empty for a new cluster)")
    u.add_argument(
        "urls",
        metavar="URL",
        nargs="*",
        default=[],
        help="nvme-tcp://HOST:PORT/NQN[/NSID] targets, one device each (at least K+M; each namespace over "
        "300 MiB and erased on the first up); none: embedded targets over images in DIR/images",
    )
    u.add_argument(
        "--ec", metavar="K+M", help="data and parity fragments, e.g. 4+2 (needed for a new cluster; K+M devices, one fragment of each object on each)"
    )
    u.add_argument(
        "--segment-size", metavar="SIZE", help="ec_object_segment_size: bytes of an object encoded at a time (default 1M; fixed once the cluster exists)"
    )
    u.add_argument(
        "--ec-type", metavar="TYPE", help="PyECLib backend (default isa_l_rs_vand, or liberasurecode_rs_vand when ISA-L is missing or M is 5 or more)"
    )
    u.add_argument("--port", type=int, metavar="P", help="the proxy's port (default: a free one, or the last up's)")
    u.add_argument(
        "--size",
        default=DEFAULT_SIZE,
        metavar="SIZE",
        help=f"size of each embedded device's sparse image (default {DEFAULT_SIZE}; more than 300 MiB for XFS; new clusters only)",
    )
    u.add_argument("--part-power", type=int, default=6, metavar="P", help="2^P partitions per ring (default 6; new clusters only)")
    json_flag(u)
    u.set_defaults(func=up)

    d = sub.add_parser(
        "down",
        help="stop the cluster in DIR and detach its devices (data kept)",
        description="Stop the servers, memcached and the supervisor, detach every device and stop the "
        "embedded targets. Images, rings and configuration stay in DIR. Safe to repeat; "
        "also cleans up after an `up` that was interrupted.",
    )
    d.add_argument("dir", metavar="DIR", help="the cluster's directory, as given to `insitu swift up`")
    json_flag(d)
    d.set_defaults(func=down)

    s = sub.add_parser(
        "status",
        help="what runs of the cluster in DIR (exit 0 when fully up, 1 otherwise)",
        description="Checks the supervisor, each server's process and port, each device's mount and "
        "embedded target, and the proxy's /healthcheck. State up, down or degraded (with "
        "problems listed); exit 0 only when up.",
    )
    s.add_argument("dir", metavar="DIR", help="the cluster's directory, as given to `insitu swift up`")
    json_flag(s)
    s.set_defaults(func=status)

    o = sub.add_parser(
        "once",
        help="run one pass of an object daemon (auditor, reconstructor, ...) in the cluster",
        description="Runs `swift-object-DAEMON DIR/object-server.conf once -v` inside the cluster's "
        "mount namespace and reports its wall time (including Python's start-up) and "
        "Swift's summary lines; its output is appended to DIR/log/object-DAEMON.log. The "
        "auditor runs unthrottled (files_per_second = bytes_per_second = 0).",
    )
    o.add_argument("dir", metavar="DIR", help="the cluster's directory, as given to `insitu swift up`")
    o.add_argument("daemon", choices=sorted(DAEMONS), help="which object daemon")
    o.add_argument("--devices", metavar="D0,D1", help="only these devices (Swift's --devices; not the updater)")
    o.add_argument("--partitions", metavar="P0,P1", help="only these partitions (Swift's --partitions; replicator and reconstructor)")
    json_flag(o)
    o.set_defaults(func=once)
    return p, {"up": u, "down": d, "status": s, "once": o}


def main(argv: List[str]) -> int:
    """Runs ``insitu swift ARGV`` (the words after ``swift``); returns the exit status:
    0 done, 1 a check found a problem (status, down with leftovers), 2 an error."""
    want_json = "--json" in argv
    try:
        top, subs = _parsers()
        if argv and argv[0] in subs:
            a, extra = subs[argv[0]].parse_known_args(argv[1:])
            a.command = argv[0]
            # `up DIR --ec 4+2 URL URL`: URLs after an option come back as extras.
            if argv[0] == "up":
                a.urls += [x for x in extra if not x.startswith("-")]
                extra = [x for x in extra if x.startswith("-")]
            if extra:
                subs[argv[0]].error(f"unrecognized arguments: {' '.join(extra)}")
        else:
            a = top.parse_args(argv)
        if a.command == "up":
            code = a.func(a)
            doc = _load(Path(a.dir).resolve()) or {}
            _emit(a, public(doc), _up_text(doc))
            return code
        if a.command == "down":
            code = a.func(a)
            dir = Path(a.dir).resolve()
            _emit(a, {"ok": True, "dir": str(dir), "state": "down"}, f"{dir} is down; its data stays: `insitu swift up {dir}` brings it back")
            return code
        return a.func(a)
    except ClusterError as e:
        if want_json:
            print(json.dumps({"error": str(e)}))
        print(f"insitu swift: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("insitu swift: interrupted", file=sys.stderr)
        return 130
    except SystemExit as e:  # --help
        return int(e.code or 0)


def _up_text(doc: dict) -> str:
    lines = [
        f"Swift is up in {doc['dir']}",
        f"  proxy   {doc['proxy']}",
        f"  auth    {doc['auth']}  (user {doc['user']}, key {doc['key']})",
        f"  storage {doc['storage_url']}",
        f"  policy  {doc['policy']['name']}: {doc['policy']['ec_type']} {doc['policy']['ec']} (default)",
    ]
    lines += [f"  {name}: {d['mount']} on {d['target']}" for name, d in doc["devices"].items()]
    lines.append(f"Try: curl -i -H 'X-Auth-User: {doc['user']}' -H 'X-Auth-Key: {doc['key']}' {doc['auth']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
