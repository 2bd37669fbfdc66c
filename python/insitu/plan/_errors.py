# SPDX-License-Identifier: Apache-2.0
"""The planner's one exception type."""

from __future__ import annotations

__all__ = ["PlanError", "MeasurementError"]


class PlanError(Exception):
    """Bad planner input or a calibration that cannot be used. The message says what is
    wrong and how to fix it; the command line prints it and exits with code 2."""


class MeasurementError(PlanError):
    """A measured run failed while running (the benchmark, an encoding worker); the
    command line exits with code 1."""
