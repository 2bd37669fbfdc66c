# SPDX-License-Identifier: Apache-2.0
"""The ``insitu`` command: the Rust command line, run in this process, except ``insitu llm
...`` and ``insitu bench llm ...``, which are Python (:mod:`insitu.llm.cli`)."""

import sys

from . import _native


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["llm"] or argv[:2] == ["bench", "llm"]:
        from .llm.cli import main as llm_main

        sys.exit(llm_main(argv))
    sys.exit(_native.cli(["insitu", *argv]))


if __name__ == "__main__":
    main()
