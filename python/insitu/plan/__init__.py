# SPDX-License-Identifier: Apache-2.0
"""``insitu plan``: how many computational drives pay off, and how a pool of them serves an LLM.

* ``insitu plan scan`` — CSDPLAN's break-even number of drives for a plain kernel (count,
  vector-add, array-merge, pagerank), from flags or from a calibration of this machine;
* ``insitu plan ec`` — CSDPLAN-EC: the same question for (n, k) Reed-Solomon encodes;
* ``insitu plan llm`` — DockerSSD's storage-pool inference model: time per token on host
  processors against a pool of computing drives, with and without a flash-resident KV
  cache, over data, tensor and pipeline parallelism;
* ``insitu plan calibrate`` — short measured runs here (``insitu bench break-even`` and
  ISA-L encodes) written to a calibration file the other subcommands read.

The models live in :mod:`insitu.plan.csdplan` (CSDPLAN and CSDPLAN-EC),
:mod:`insitu.plan.kernels` (calibrated kernel predictions) and :mod:`insitu.plan.llm`;
:func:`insitu.plan.cli.main` is the command line. Bad input raises :class:`PlanError`; a
measured run that fails, :class:`MeasurementError`.
"""

from ._errors import MeasurementError, PlanError
from .csdplan import BreakEvenModel, EcBreakEvenModel, EncodeCost

__all__ = ["PlanError", "MeasurementError", "BreakEvenModel", "EcBreakEvenModel", "EncodeCost"]
