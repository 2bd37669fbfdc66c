# SPDX-License-Identifier: Apache-2.0
"""The ``insitu`` command: the Rust command line, run in this process, except ``insitu llm
...``, ``insitu bench llm ...`` (:mod:`insitu.llm.cli`) and ``insitu bench containers``
(:mod:`insitu.bench_containers`), which are Python."""

import sys

from . import _native


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["llm"] or argv[:2] == ["bench", "llm"]:
        from .llm.cli import main as llm_main

        sys.exit(llm_main(argv))
    if argv[:2] == ["bench", "containers"]:
        from .bench_containers import main as containers_main

        sys.exit(containers_main(argv[2:]))
    sys.exit(_native.cli(["insitu", *argv]))


if __name__ == "__main__":
    main()
