# SPDX-License-Identifier: Apache-2.0
"""``python -m insitu.plan ARGS`` = ``insitu plan ARGS``."""

import sys

from .cli import main

sys.exit(main(sys.argv[1:]))
