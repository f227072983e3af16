"""Checkpoint plans as data, and installed on a model (while tracing, or for real).

- :mod:`~fxmem.trace.plans.regions`: :class:`Plan` and :class:`Region`, what a plan is;
- :mod:`~fxmem.trace.plans.checkpointing`: a plan installed with ``torch.utils.checkpoint``
  (:func:`apply_checkpoints`), and while a step is traced;
- :mod:`~fxmem.trace.plans.selective`: selective (per-op) checkpointing's policies.

A plan traced here must run as the same plan applied to the user's model runs: the planner
(``fxmem.checkpoint``) derives plans from one trace and confirms the chosen one by tracing it.
"""

from .checkpointing import (
    apply_checkpoints,
    cache_layers,
    check_plan,
    drops_a_cache,
    normalize_plan,
)
from .regions import Plan, Region, load_plan, modules_of

__all__ = ["Plan", "Region", "apply_checkpoints", "cache_layers", "check_plan", "drops_a_cache",
           "load_plan", "modules_of", "normalize_plan"]
