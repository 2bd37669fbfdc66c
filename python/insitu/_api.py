# SPDX-License-Identifier: Apache-2.0
"""The Python API: thin wrappers that call the Rust host library and parse its JSON."""

import json
import os
from typing import Any, Dict, Iterable, List, Optional, Union

from . import _native

PathArg = Union[str, "os.PathLike[str]", Iterable[Union[str, "os.PathLike[str]"]]]


def _paths(paths: PathArg) -> List[str]:
    if isinstance(paths, (str, os.PathLike)):
        return [os.fspath(paths)]
    return [os.fspath(p) for p in paths]


def _arg(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def exec(  # noqa: A001 - the verb is the command's name
    function: str,
    paths: PathArg,
    *,
    conventional: bool = False,
    output: Optional[str] = None,
    force: bool = False,
    **args: Any,
) -> Dict[str, Any]:
    """Runs ``function`` over ``paths``, offloaded unless ``conventional``.

    Keyword arguments other than the named ones are the function's arguments, e.g.
    ``exec("grep", p, pattern="ERROR", ignore_case=True)``. Functions that write a result
    file (``zstd``, ``sort``, ``csv-select``) write it next to the input, or to ``output``.
    """
    pairs = [f"{k}={_arg(v)}" for k, v in args.items()]
    out = os.fspath(output) if output is not None else None
    return json.loads(_native.exec_json(function, _paths(paths), pairs, conventional, out, force))


def grep(pattern: str, paths: PathArg, *, regex: bool = False, ignore_case: bool = False, **kw: Any) -> Dict[str, Any]:
    """Matching-line counts and (line, byte offset) of each match, like ``grep -c``/``-n -b``."""
    return exec("grep", paths, pattern=pattern, regex=regex, ignore_case=ignore_case, **kw)


def wc(paths: PathArg, **kw: Any) -> Dict[str, Any]:
    """Lines, words and bytes of each file, like ``wc``."""
    return exec("wc", paths, **kw)


def checksum(paths: PathArg, function: str = "crc32c", **kw: Any) -> Dict[str, Any]:
    """Hex digests (``crc32c``, ``xxh3``, ``sha256`` or ``blake3``) of each file."""
    return exec(function, paths, **kw)


def scrub(directory: str, manifest: str, *, create: bool = False, function: str = "blake3", conventional: bool = False) -> Dict[str, Any]:
    """Records (``create=True``) or verifies a bitrot manifest of every file under ``directory``.

    The verify report lists ``corrupted``, ``missing`` and ``new`` files.
    """
    return json.loads(_native.scrub_json(os.fspath(directory), os.fspath(manifest), create, function, conventional))


def functions() -> List[Dict[str, Any]]:
    """The functions a target runs, with their arguments."""
    return json.loads(_native.functions_json())
