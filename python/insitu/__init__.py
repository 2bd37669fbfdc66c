# SPDX-License-Identifier: Apache-2.0
"""insitu: computational storage. Run functions where the data is.

A file on a loop-mounted image (or an insitu namespace) becomes a *virtual object*: its
extent list and length, found with ``stat`` and FIEMAP. The object travels in a compute
descriptor with one EXEC command to the target holding the blocks, and only the result
comes back::

    import insitu
    r = insitu.exec("crc32c", ["/mnt/data/a.log", "/mnt/data/b.log"])
    r["results"][0]["value"], r["stats"]["bytes_to_host"]
    insitu.grep("ERROR", "/mnt/data/a.log")["results"][0]["count"]

Every call returns the same document ``insitu ... --json`` prints: ``results`` (one per
file) and ``stats`` (``bytes_to_host``, ``bytes_from_host``, ``media_bytes``,
``seconds``, ``commands``). ``conventional=True`` runs the same computation on the host,
reading through the file system with a cold cache, for comparison.

``insitu.Session(url)`` is the user-space NVMe/TCP initiator: identify, read, write,
flush and EXEC against a target started with ``insitu target start``.
``insitu.lock(path)`` takes DockerSSD's inode lock on a file or directory of a file system
attached with ``insitu attach``: while held, the host cannot modify it (writers get EROFS,
the target refuses writes to its blocks) and the target's containers see its synced
content; ``with insitu.lock(p) as l: ...`` or ``l.unlock()`` / ``insitu.unlock(p)``
release it, ``insitu.locks()`` lists the held ones. Locks are not persistent.
``insitu.kv(url)`` opens a target's key-value store (NVMe Key Value command set, a target
started with ``--kv-store SIZE``) as a mutable mapping: ``m[b"k"] = b"v"`` returns once the
target made it durable, ``m[b"k"]``, ``del m[b"k"]``, ``b"k" in m``, ``m.keys(prefix=b"")``.
``insitu.KvTarget(url)`` drives a target's KV cache and attention engine (the LLM
integration in ``insitu.llm`` uses it); the sequences it creates are freed by the target
when its connection ends, unless created with ``kept=True``.
``insitu.EmbeddedTarget(dir, ...)`` serves a target from this process on loopback.

Exceptions::

    InsituError
     ├── RequestError          unknown function, bad argument, bad path
     ├── NotOffloadableError   file not on an insitu device, or not safely readable there
     ├── TargetError           the target refused or failed the command (NVMe status)
     └── StorageIOError        an I/O call on the host failed
"""

from ._api import checksum, exec, functions, grep, scrub, wc
from ._kv_store import KvStore, kv
from ._native import (
    EmbeddedTarget,
    InsituError,
    KvTarget,
    Lock,
    Session,
    NotOffloadableError,
    RequestError,
    StorageIOError,
    TargetError,
    lock,
    locks,
    unlock,
)

__all__ = [
    "exec",
    "grep",
    "wc",
    "checksum",
    "scrub",
    "functions",
    "Session",
    "kv",
    "KvStore",
    "KvTarget",
    "EmbeddedTarget",
    "lock",
    "unlock",
    "locks",
    "Lock",
    "InsituError",
    "RequestError",
    "NotOffloadableError",
    "TargetError",
    "StorageIOError",
]

for _name in ("InsituError", "RequestError", "NotOffloadableError", "TargetError", "StorageIOError"):
    globals()[_name].__module__ = "insitu"
del _name
