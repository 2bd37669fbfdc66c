# SPDX-License-Identifier: Apache-2.0
"""The ``insitu`` command: the Rust command line, run in this process."""

import sys

from . import _native


def main() -> None:
    sys.exit(_native.cli(["insitu", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
