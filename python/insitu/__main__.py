# SPDX-License-Identifier: Apache-2.0
"""The ``insitu`` command: the Rust command line, run in this process, except what is
Python: ``insitu llm ...`` and ``insitu bench llm ...`` (:mod:`insitu.llm.cli`), ``insitu
bench containers`` (:mod:`insitu.bench_containers`), ``insitu plan ...``
(:mod:`insitu.plan`), ``insitu swift ...`` (:mod:`insitu.swift.cli`), and ``wc``,
``grep``, ``exec`` and ``scrub`` on Swift objects (:mod:`insitu.swift`)."""

import sys

from . import _native


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["llm"] or argv[:2] == ["bench", "llm"]:
        from .llm.cli import main as llm_main

        sys.exit(llm_main(argv))
    if argv[:1] == ["plan"]:
        from .plan.cli import main as plan_main

        sys.exit(plan_main(argv[1:]))
    if argv[:1] == ["swift"]:
        from .swift.cli import main as swift_main

        sys.exit(swift_main(argv[1:]))
    if argv[:1] in (["wc"], ["grep"], ["exec"]) and any(a.startswith("swift://") for a in argv):
        from .swift.offload import main as swift_offload

        sys.exit(swift_offload(argv))
    if argv[:1] == ["scrub"] and any(a == "--swift-dir" or a.startswith("--swift-dir=") for a in argv):
        from .swift.scrub import main as swift_scrub

        sys.exit(swift_scrub(argv[1:]))
    if argv[:2] == ["bench", "containers"]:
        from .bench_containers import main as containers_main

        sys.exit(containers_main(argv[2:]))
    sys.exit(_native.cli(["insitu", *argv]))


if __name__ == "__main__":
    main()
