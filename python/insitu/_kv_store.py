# SPDX-License-Identifier: Apache-2.0
"""``insitu.kv(url)``: a target's key-value store as a mutable mapping."""

from collections.abc import MutableMapping

from ._native import KvNamespace

MAX_KEY = 16


def _key(key):
    """Key as bytes: ``str`` as UTF-8, bytes-like as is; ValueError when not 1-16 bytes."""
    if isinstance(key, str):
        b = key.encode("utf-8")
    elif isinstance(key, (bytes, bytearray, memoryview)):
        b = bytes(key)
    else:
        raise TypeError(f"keys are bytes or str, not {type(key).__name__}")
    if not 1 <= len(b) <= MAX_KEY:
        raise ValueError(f"the key {key!r} has {len(b)} bytes: keys are 1 to {MAX_KEY} bytes (the NVMe Key Value command set carries them in the command)")
    return b


def _value(value):
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"values are bytes-like (bytes, bytearray, memoryview), not {type(value).__name__}")


class KvStore(MutableMapping):
    """The key-value namespace of an NVMe/TCP target (NVMe Key Value command set).

    ``m = insitu.kv("nvme-tcp://127.0.0.1:4420/nqn.2024-01.io.insitu:target")``; then
    ``m[k] = v`` (returns once the target has made the value durable), ``m[k]``
    (KeyError when absent), ``del m[k]`` (KeyError when absent), ``k in m``,
    ``m.keys(prefix=b"")`` (a list of bytes keys in byte order), ``iter(m)``, ``len(m)``,
    ``m.get(k, default)`` and the other ``MutableMapping`` methods.

    Keys are 1 to 16 bytes: ``bytes`` or ``str`` (UTF-8); other lengths raise ValueError
    and change nothing. Values are bytes-like; reads return ``bytes``. ``len`` and
    iteration list the keys with List commands, so they cost a round trip per 64 KiB of
    keys.
    """

    def __init__(self, url, hostnqn=None):
        self._ns = KvNamespace(url, hostnqn)

    @property
    def nsid(self):
        """NSID of the key-value namespace."""
        return self._ns.nsid

    @property
    def url(self):
        """The URL the store was opened with."""
        return self._ns.url

    def __getitem__(self, key):
        return self._ns.retrieve(_key(key))

    def __setitem__(self, key, value):
        self._ns.store(_key(key), _value(value))

    def __delitem__(self, key):
        self._ns.delete(_key(key))

    def __contains__(self, key):
        try:
            k = _key(key)
        except (TypeError, ValueError):
            return False
        return self._ns.exists(k)

    def keys(self, prefix=b""):
        """Keys starting with ``prefix`` (bytes or str; empty: all), a list in byte order."""
        p = prefix.encode("utf-8") if isinstance(prefix, str) else bytes(prefix)
        return self._ns.keys(p)

    def __iter__(self):
        return iter(self._ns.keys(b""))

    def __len__(self):
        return len(self._ns.keys(b""))

    def close(self):
        """Disconnects from the target."""
        self._ns.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"insitu.kv({self.url!r}) (namespace {self.nsid})"


def kv(url, hostnqn=None):
    """Opens the key-value store of the target at ``url`` as a mutable mapping.

    ``url`` is ``nvme-tcp://HOST:PORT/NQN[/NSID]``; without NSID the namespace whose
    Identify reports the Key Value command set is used (a target started with
    ``insitu target start --private IMG --kv-store SIZE``). ``hostnqn`` defaults to this
    host's stable NQN. See :class:`KvStore` for the interface.
    """
    return KvStore(url, hostnqn)


KvStore.__module__ = "insitu"
kv.__module__ = "insitu"
