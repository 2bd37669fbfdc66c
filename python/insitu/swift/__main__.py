# SPDX-License-Identifier: Apache-2.0
"""``python -m insitu.swift up|down|status|once ...``: the same as ``insitu swift ...``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
