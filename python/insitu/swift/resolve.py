# SPDX-License-Identifier: Apache-2.0
"""Finding a Swift object's erasure-coded fragment archives the way Swift does.

An object name hashes (MD5 of the cluster's path prefix, ``/account/container/object`` and
suffix) to a partition of the policy's ring; each device of the ring keeps the object's
files in ``objects-N/<part>/<last 3 hex of the hash>/<hash>/``. An erasure-coded policy
stores fragment archive ``i`` as ``<timestamp>#<i>#d.data``: per segment of the object, an
80-byte liberasurecode header and ``size`` bytes of fragment ``i``. The code is systematic,
so data fragment ``i`` of segment ``s`` holds the object's bytes from
``s * segment_size + i * size`` (the last segment's last fragments are zero padding).

Everything read here comes from disk and is checked before use: the ring's magic and
shape, the metadata pickle (through an unpickler that builds only plain values), each
fragment header's magic, index and sizes. A problem is a :class:`SwiftError` naming the
file, and nothing is ever written.
"""

from __future__ import annotations

import configparser
import errno
import gzip
import hashlib
import io
import json
import os
import pickle
import re
import struct
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

#: liberasurecode's fragment header: ``fragment_header_t``, 80 bytes, native byte order.
HEADER_LEN = 80
HEADER_MAGIC = 0x0B0C5ECC
#: idx, size, backend metadata size, original (segment) size, checksum type.
_META = struct.Struct("<IIIQB")
_MAGIC_AT = 59


class SwiftError(Exception):
    """A Swift object cannot be resolved or read: the message says which and why."""


@dataclass(frozen=True)
class Policy:
    """One storage policy of ``swift.conf``."""

    index: int
    name: str
    kind: str  # "replication" or "erasure_coding"
    ec_type: str = ""
    k: int = 0
    m: int = 0
    segment_size: int = 0

    @property
    def objects_dir(self) -> str:
        return "objects" if self.index == 0 else f"objects-{self.index}"

    @property
    def ring_name(self) -> str:
        return "object.ring.gz" if self.index == 0 else f"object-{self.index}.ring.gz"


@dataclass(frozen=True)
class SwiftConf:
    """The parts of ``swift.conf`` that place objects."""

    prefix: bytes
    suffix: bytes
    policies: Tuple[Policy, ...]

    @classmethod
    def load(cls, swift_dir: Path) -> "SwiftConf":
        path = swift_dir / "swift.conf"
        cp = configparser.ConfigParser(interpolation=None)
        try:
            with open(path, encoding="utf-8") as f:
                cp.read_file(f)
        except OSError as e:
            raise SwiftError(f"{path}: {e.strerror or e} (is --swift-dir the directory holding swift.conf and the rings?)") from None
        except configparser.Error as e:
            raise SwiftError(f"{path}: not a valid swift.conf: {e}") from None
        prefix = cp.get("swift-hash", "swift_hash_path_prefix", fallback="").encode()
        suffix = cp.get("swift-hash", "swift_hash_path_suffix", fallback="").encode()
        if not prefix and not suffix:
            raise SwiftError(f"{path}: [swift-hash] sets neither swift_hash_path_prefix nor swift_hash_path_suffix")
        policies = []
        for section in cp.sections():
            m = re.fullmatch(r"storage-policy:(\d+)", section)
            if not m:
                continue
            s = cp[section]
            kind = s.get("policy_type", "replication")
            try:
                policies.append(
                    Policy(
                        index=int(m.group(1)),
                        name=s.get("name", section),
                        kind=kind,
                        ec_type=s.get("ec_type", ""),
                        k=int(s.get("ec_num_data_fragments", "0")),
                        m=int(s.get("ec_num_parity_fragments", "0")),
                        segment_size=int(s.get("ec_object_segment_size", "1048576")),
                    )
                )
            except ValueError as e:
                raise SwiftError(f"{path}: [{section}]: {e}") from None
        if not policies:
            policies.append(Policy(0, "Policy-0", "replication"))
        return cls(prefix, suffix, tuple(sorted(policies, key=lambda p: p.index)))

    def hash_path(self, account: str, container: str, obj: str) -> str:
        """Swift's ``hash_path``: the object's hash, hex."""
        path = "/" + "/".join([account, container, obj])
        return hashlib.md5(self.prefix + path.encode() + self.suffix).hexdigest()


@dataclass(frozen=True)
class Device:
    """A device of a ring."""

    id: int
    name: str
    ip: str
    port: int


@dataclass(frozen=True)
class Ring:
    """An object ring: which devices hold each partition."""

    part_shift: int
    replicas: Tuple[Tuple[int, ...], ...]
    devices: Dict[int, Device]

    @classmethod
    def load(cls, path: Path) -> "Ring":
        """Reads a ring file as Swift writes it (``R1NG``, version 1: JSON, then one array of
        device ids per replica)."""
        try:
            with gzip.open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise SwiftError(f"{path}: no such ring") from None
        except (OSError, EOFError) as e:
            raise SwiftError(f"{path}: not a readable ring: {e}") from None
        return cls.parse(raw, str(path))

    @classmethod
    def parse(cls, raw: bytes, name: str = "ring") -> "Ring":
        bad = lambda why: SwiftError(f"{name}: {why}")  # noqa: E731
        if raw[:4] != b"R1NG" or len(raw) < 10:
            raise bad("not a Swift ring (no R1NG magic)")
        (version,) = struct.unpack_from("!H", raw, 4)
        if version != 1:
            raise bad(f"ring format version {version} is not supported (1 is)")
        (jlen,) = struct.unpack_from("!I", raw, 6)
        if 10 + jlen > len(raw):
            raise bad("ring metadata runs past the end of the file")
        try:
            meta = json.loads(raw[10 : 10 + jlen])
            shift = int(meta["part_shift"])
            replica_count = meta["replica_count"]
            width = int(meta.get("dev_id_bytes", 2))
            order = meta.get("byteorder", "little")
        except (ValueError, KeyError, TypeError) as e:
            raise bad(f"ring metadata is malformed: {e}") from None
        if not 0 < shift <= 32 or width not in (2, 4) or order not in ("little", "big"):
            raise bad("ring metadata has impossible values")
        parts = 1 << (32 - shift)
        full = int(replica_count)
        at = 10 + jlen
        rows: List[Tuple[int, ...]] = []
        # A fractional replica count leaves a last, shorter row.
        lengths = [parts] * full
        extra = int(round((replica_count - full) * parts))
        if extra:
            lengths.append(extra)
        for n in lengths:
            need = n * width
            if at + need > len(raw):
                raise bad("ring assignment table is truncated")
            row = array("H" if width == 2 else "I")
            row.frombytes(raw[at : at + need])
            if (order == "little") != (struct.pack("=H", 1) == b"\x01\x00"):
                row.byteswap()
            rows.append(tuple(row))
            at += need
        devices: Dict[int, Device] = {}
        for d in meta.get("devs", []):
            if d is None:
                continue
            try:
                devices[int(d["id"])] = Device(int(d["id"]), str(d["device"]), str(d.get("ip", "")), int(d.get("port", 0)))
            except (KeyError, TypeError, ValueError) as e:
                raise bad(f"a device entry is malformed: {e}") from None
        for row in rows:
            for dev in row:
                if dev not in devices and dev != (0xFFFF if width == 2 else 0xFFFFFFFF):
                    raise bad(f"the assignment table names device id {dev}, which the ring does not list")
        return cls(shift, tuple(rows), devices)

    def partition(self, hash_hex: str) -> int:
        return struct.unpack_from(">I", bytes.fromhex(hash_hex))[0] >> self.part_shift

    def nodes(self, part: int) -> List[Device]:
        return [self.devices[row[part]] for row in self.replicas if part < len(row) and row[part] in self.devices]


class _PlainUnpickler(pickle.Unpickler):
    """Builds only dicts, lists, tuples, strings, bytes and numbers: metadata on a device is
    outside input, and a pickle that names anything else is refused instead of run. The one
    callable allowed is how pickle protocol 2 spells bytes (``_codecs.encode(text,
    "latin1")``), which Swift's metadata uses."""

    def find_class(self, module: str, name: str):  # noqa: D401 - pickle's hook
        if (module, name) == ("_codecs", "encode"):
            return _latin1
        raise pickle.UnpicklingError(f"metadata names {module}.{name}; only plain values are accepted")


def _latin1(text: str, encoding: str = "latin1") -> bytes:
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise pickle.UnpicklingError(f"metadata encodes bytes as {encoding!r}; only latin1 is accepted")
    return text.encode("latin1")


def read_metadata(path: Path) -> Dict[str, str]:
    """The ``user.swift.metadata`` pickle of a Swift file (split over ``metadata1``, ... when
    long), with keys and values as text."""
    chunks = []
    for i in range(64):
        key = "user.swift.metadata" + (str(i) if i else "")
        try:
            chunks.append(os.getxattr(path, key))
        except OSError as e:
            if e.errno not in (errno.ENODATA, errno.ENOTSUP):  # not "no such attribute": EIO, a missing file...
                raise SwiftError(f"{path}: user.swift.metadata cannot be read: {e.strerror or e}") from None
            break
    if not chunks:
        raise SwiftError(f"{path}: no user.swift.metadata (not a Swift object file)")
    return parse_metadata(b"".join(chunks), str(path))


def parse_metadata(raw: bytes, where: str) -> Dict[str, str]:
    """The metadata pickle ``raw`` as text keys and values; a :class:`SwiftError` for anything
    but a pickled mapping of plain values."""
    try:
        meta = _PlainUnpickler(io.BytesIO(raw)).load()
    except Exception as e:  # any malformed pickle, whatever the unpickler raises
        raise SwiftError(f"{where}: unreadable user.swift.metadata: {e}") from None
    if not isinstance(meta, dict):
        raise SwiftError(f"{where}: user.swift.metadata is not a mapping")
    text = lambda v: v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else str(v)  # noqa: E731
    return {text(k): text(v) for k, v in meta.items()}


@dataclass(frozen=True)
class Header:
    """One fragment header."""

    index: int
    size: int
    segment: int

    @classmethod
    def parse(cls, raw: bytes, where: str) -> "Header":
        if len(raw) < HEADER_LEN:
            raise SwiftError(f"{where}: corrupt fragment header: only {len(raw)} bytes")
        idx, size, _backend, orig, _ck = _META.unpack_from(raw)
        (magic,) = struct.unpack_from("<I", raw, _MAGIC_AT)
        if magic != HEADER_MAGIC:
            raise SwiftError(f"{where}: corrupt fragment header: magic {magic:#x}, expected {HEADER_MAGIC:#x}")
        return cls(idx, size, orig)


@dataclass
class Archive:
    """One fragment archive: the file, what it holds, and where its records are."""

    index: int
    device: str
    path: Path
    size: int
    metadata: Dict[str, str]
    #: Record layout: bytes of fragment data in every record but the last, and in the last.
    frag_size: int = 0
    last_frag_size: int = 0


@dataclass
class SwiftObject:
    """A resolved erasure-coded object."""

    url: str
    policy: Policy
    partition: int
    hash: str
    length: int
    segment_size: int
    etag: str
    archives: Dict[int, Archive] = field(default_factory=dict)
    #: Fragment index -> device name, for archives whose device could not be read.
    missing: Dict[int, str] = field(default_factory=dict)

    @property
    def segments(self) -> int:
        return -(-self.length // self.segment_size) if self.length else 0

    def segment_len(self, s: int) -> int:
        return min(self.segment_size, self.length - s * self.segment_size)

    def pieces(self) -> List[Tuple[int, int, int, int]]:
        """The object's data in order: ``(segment, fragment, offset in the object, length)``
        for every data fragment of every segment that holds object bytes."""
        out = []
        for s in range(self.segments):
            seg = self.segment_len(s)
            fs = self.frag_size(s)
            for i in range(self.policy.k):
                n = max(0, min(fs, seg - i * fs))
                if n:
                    out.append((s, i, s * self.segment_size + i * fs, n))
        return out

    def frag_size(self, s: int) -> int:
        a = next(iter(self.archives.values()))
        return a.last_frag_size if s == self.segments - 1 else a.frag_size

    def record_offset(self, s: int) -> int:
        """Where segment ``s``'s record starts in every archive."""
        a = next(iter(self.archives.values()))
        return s * (HEADER_LEN + a.frag_size)


def parse_url(url: str) -> Tuple[str, str, str]:
    m = re.fullmatch(r"swift://([^/]+)/([^/]+)/(.+)", url)
    if not m:
        raise SwiftError(f"{url}: not a swift://ACCOUNT/CONTAINER/OBJECT URL")
    return m.group(1), m.group(2), m.group(3)


def devices_root(swift_dir: Path, devices: Optional[Path]) -> Path:
    """Where the devices are mounted: ``--devices``, else ``SWIFT_DIR/node`` (an ``insitu
    swift up`` cluster), else ``/srv/node``."""
    if devices is not None:
        return devices
    local = swift_dir / "node"
    return local if local.is_dir() else Path("/srv/node")


def _newest(hash_dir: Path) -> Optional[Tuple[str, Path]]:
    """The newest ``.data`` or ``.ts`` in an object's hash directory: (kind, path)."""
    try:
        names = os.listdir(hash_dir)
    except FileNotFoundError:
        return None
    best = None
    for n in names:
        if n.endswith(".data") or n.endswith(".ts"):
            # <ts>.data, <ts>#<frag>#d.data, <ts>.ts: the timestamp ends at the first '#' or at
            # the suffix; Swift writes it fixed-width, so text order is time order.
            ts = n.rsplit(".", 1)[0].split("#", 1)[0]
            key = (ts, n.endswith(".data"))
            if best is None or key > best[0]:
                best = (key, n)
    if best is None:
        return None
    return ("data" if best[1].endswith(".data") else "ts"), hash_dir / best[1]


def resolve(url: str, swift_dir: Path, devices: Optional[Path] = None, readable=lambda dev_dir: True) -> SwiftObject:
    """Finds the fragment archives of ``url``. ``readable(dev_dir)`` says whether a device can
    be read now (its target is up); those that cannot are listed in ``missing`` by the
    fragment index the ring gives them."""
    account, container, name = parse_url(url)
    conf = SwiftConf.load(swift_dir)
    root = devices_root(swift_dir, devices)
    h = conf.hash_path(account, container, name)
    found = []
    for policy in conf.policies:
        ring_path = swift_dir / policy.ring_name
        if not ring_path.exists():
            continue
        ring = Ring.load(ring_path)
        part = ring.partition(h)
        hits, down = [], {}
        primaries = ring.nodes(part)
        for node_index, dev in enumerate(primaries + [d for d in ring.devices.values() if d not in primaries]):
            dev_dir = root / dev.name
            if not readable(dev_dir):
                if node_index < len(primaries):
                    down[node_index] = dev.name
                continue
            newest = _newest(dev_dir / policy.objects_dir / str(part) / h[-3:] / h)
            if newest:
                hits.append((dev.name, newest))
        if hits or down:
            found.append((policy, part, hits, down))
    if not found or not any(hits for _, _, hits, _ in found):
        if found:
            raise SwiftError(f"{url}: every device that could hold it is unreachable")
        raise SwiftError(f"{url}: no such object (no file for hash {h} on any device under {root})")
    policy, part, hits, down = next((f for f in found if f[2]), found[0])
    if policy.kind != "erasure_coding":
        raise SwiftError(
            f"{url}: stored under the replicated policy {policy.name!r} (index {policy.index}); offload on Swift objects reads erasure-coded fragment archives"
        )
    if all(kind == "ts" for _, (kind, _) in hits):
        raise SwiftError(f"{url}: no such object (deleted)")
    obj: Optional[SwiftObject] = None
    for dev, (kind, path) in hits:
        if kind != "data":
            continue
        m = re.search(r"#(\d+)(#d)?\.data$", path.name)
        if not m:
            raise SwiftError(f"{path}: not an erasure-coded fragment archive name")
        meta = read_metadata(path)
        frag = int(m.group(1))
        try:
            length = int(meta["X-Object-Sysmeta-Ec-Content-Length"])
            segment = int(meta.get("X-Object-Sysmeta-Ec-Segment-Size", policy.segment_size))
        except (KeyError, ValueError):
            raise SwiftError(f"{path}: metadata lacks the erasure-coding sizes") from None
        if obj is None:
            obj = SwiftObject(url, policy, part, h, length, segment, meta.get("X-Object-Sysmeta-Ec-Etag", ""))
        if frag not in obj.archives:
            obj.archives[frag] = Archive(frag, dev, path, path.stat().st_size, meta)
    assert obj is not None
    obj.missing = {i: d for i, d in down.items() if i not in obj.archives}
    for a in obj.archives.values():
        _read_layout(obj, a)
    return obj


def _read_layout(obj: SwiftObject, a: Archive) -> None:
    """Reads the first and last record headers of an archive and checks the file's size."""
    nseg = obj.segments
    if nseg == 0:  # an empty object's archives are empty files
        if a.size:
            raise SwiftError(f"{a.path}: {a.size} bytes in the archive of an empty object")
        return
    with open(a.path, "rb") as f:
        first = Header.parse(f.read(HEADER_LEN), f"{a.path} (segment 0)")
        if first.index != a.index:
            raise SwiftError(f"{a.path}: corrupt fragment header: index {first.index} in the archive of fragment {a.index}")
        last = first
        if nseg > 1:
            f.seek((nseg - 1) * (HEADER_LEN + first.size))
            last = Header.parse(f.read(HEADER_LEN), f"{a.path} (segment {nseg - 1})")
    want_last = obj.segment_len(nseg - 1) if nseg else 0
    if (nseg > 1 and first.segment != obj.segment_size) or last.segment != want_last or last.index != a.index:
        raise SwiftError(
            f"{a.path}: corrupt fragment header: segment sizes {first.segment}/{last.segment} do not fit an object of {obj.length} bytes in {obj.segment_size}-byte segments"
        )
    expect = (nseg - 1) * (HEADER_LEN + first.size) + HEADER_LEN + last.size
    if a.size != expect:
        raise SwiftError(f"{a.path}: {a.size} bytes, but its headers describe {expect}")
    a.frag_size, a.last_frag_size = first.size, last.size
