# SPDX-License-Identifier: Apache-2.0
"""A minimal client of the Swift object API, on ``urllib`` alone: tempauth v1.0 and the
handful of container and object calls that tests and examples need.

    storage_url, token = auth("http://127.0.0.1:8080/auth/v1.0", "test:tester", "testing")
    put_container(storage_url, token, "c")
    put_object(storage_url, token, "c", "o", b"data")
    assert get_object(storage_url, token, "c", "o") == b"data"

Every call raises :class:`SwiftError` on an HTTP status of 300 or more (with the method,
URL, status and body), and ``urllib.error.URLError`` when nothing answers. A 503 (the
proxy found too few object servers in time, as on a loaded machine) is retried with
backoff first, as the stock ``swift`` client retries.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Dict, Mapping, Optional, Tuple

__all__ = [
    "SwiftError",
    "auth",
    "put_container",
    "delete_container",
    "put_object",
    "get_object",
    "head_object",
    "delete_object",
]

#: Seconds each request may take; Swift answers on loopback in milliseconds, but an EC PUT
#: of a large object encodes on the proxy first.
TIMEOUT = 120.0

#: Seconds to wait before each retry of a 503.
RETRY_BACKOFF = (0.5, 1.0, 2.0, 4.0)


class SwiftError(Exception):
    """A Swift request answered with an error status."""

    def __init__(self, method: str, url: str, status: int, reason: str, body: bytes):
        self.method, self.url, self.status, self.reason, self.body = method, url, status, reason, body
        text = body[:300].decode("utf-8", "replace").strip()
        super().__init__(f"{method} {url}: {status} {reason}" + (f": {text}" if text else ""))


def _request(
    method: str, url: str, token: Optional[str] = None, data: Optional[bytes] = None, headers: Optional[Mapping[str, str]] = None
) -> Tuple[int, Dict[str, str], bytes]:
    h = dict(headers or {})
    if token is not None:
        h["X-Auth-Token"] = token
    if data is not None:
        h.setdefault("Content-Length", str(len(data)))
    for wait in (*RETRY_BACKOFF, None):
        req = urllib.request.Request(url, data=data, headers=h, method=method)
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
        except urllib.error.HTTPError as e:
            body = e.read() if e.fp is not None else b""
            if e.code != 503 or wait is None:
                raise SwiftError(method, url, e.code, e.reason, body) from None
        time.sleep(wait)
    raise AssertionError("unreachable: the last try returns or raises")


def _url(storage_url: str, *parts: str) -> str:
    return storage_url.rstrip("/") + "".join("/" + urllib.parse.quote(p, safe="/") for p in parts)


def auth(url: str, user: str, key: str) -> Tuple[str, str]:
    """Logs in with tempauth v1.0 and returns ``(storage_url, token)``.

    `url` is the auth URL (``http://HOST:PORT/auth/v1.0``) or the proxy's base URL, to
    which ``/auth/v1.0`` is added. `user` is ``account:user``."""
    if "/auth/" not in url:
        url = url.rstrip("/") + "/auth/v1.0"
    _, headers, _ = _request("GET", url, headers={"X-Auth-User": user, "X-Auth-Key": key})
    try:
        return headers["x-storage-url"], headers["x-auth-token"]
    except KeyError:
        raise SwiftError("GET", url, 200, "no X-Storage-Url or X-Auth-Token in the answer", b"") from None


def put_container(storage_url: str, token: str, container: str, headers: Optional[Mapping[str, str]] = None) -> None:
    """Creates `container` (no error if it exists). ``{"X-Storage-Policy": NAME}`` in
    `headers` picks a storage policy; without it the cluster's default applies."""
    _request("PUT", _url(storage_url, container), token, b"", headers)


def delete_container(storage_url: str, token: str, container: str) -> None:
    """Deletes an empty `container`."""
    _request("DELETE", _url(storage_url, container), token)


def put_object(storage_url: str, token: str, container: str, name: str, data: bytes, headers: Optional[Mapping[str, str]] = None) -> str:
    """Stores `data` as `container`/`name`; returns the ETag Swift computed (the MD5 of
    `data`). The Content-Type is application/octet-stream unless `headers` say otherwise."""
    h = {"Content-Type": "application/octet-stream", **(headers or {})}
    _, h, _ = _request("PUT", _url(storage_url, container, name), token, bytes(data), h)
    return h.get("etag", "")


def get_object(storage_url: str, token: str, container: str, name: str, headers: Optional[Mapping[str, str]] = None) -> bytes:
    """The bytes of `container`/`name` (or of the range a ``Range`` header asks for)."""
    return _request("GET", _url(storage_url, container, name), token, None, headers)[2]


def head_object(storage_url: str, token: str, container: str, name: str) -> Dict[str, str]:
    """The object's headers, names in lower case (``content-length``, ``etag``,
    ``x-timestamp``, ``x-object-meta-*``...)."""
    return _request("HEAD", _url(storage_url, container, name), token)[1]


def delete_object(storage_url: str, token: str, container: str, name: str) -> None:
    """Deletes `container`/`name`."""
    _request("DELETE", _url(storage_url, container, name), token)
