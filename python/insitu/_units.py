# SPDX-License-Identifier: Apache-2.0
"""Sizes as users write them on the command line."""


def parse_size(text: str) -> int:
    """Bytes in `text`: a number with an optional K, M, G or T suffix (powers of 1024;
    `KiB`, `MB` and the like read the same), e.g. ``"128M"`` or ``"1.5G"``."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    s = text.strip().lower().rstrip("ib")
    return int(float(s[:-1]) * units[s[-1]]) if s and s[-1] in units else int(s)
