"""``compile=``: the step's model compiled with ``torch.compile``, as a step option.

``fxmem.analyze(model, ..., compile=True)`` is ``fxmem.analyze(torch.compile(model), ...)``
on one GPU, and under a parallel strategy (``parallel=``) each of the model's repeated blocks
compiled in place before the strategy wraps it, as torchtitan compiles a transformer's blocks
(:meth:`Compile.blocks`);
``compile={"activation_memory_budget": 0.5}`` also sets AOTAutograd's partitioner budget
(``torch._functorch.config.activation_memory_budget``, 1.0 by default: save what the
min-cut partition saves; lower: recompute more in backward to save less) while the step is
compiled, and ``"mode"`` or ``"options"`` are ``torch.compile``'s. The trace then runs
inductor's own code (:mod:`fxmem.trace.compiled.inductor`); :func:`fxmem.measure` compiles the real
model the same way, at the example's batch size with B dynamic, then measures at B.

>>> Compile.of(True)
Compile(activation_memory_budget=None, mode=None, options=())
>>> Compile.of({"activation_memory_budget": 0.5}).activation_memory_budget
0.5
>>> Compile.of(False) is None
True
>>> Compile.of({"budget": 0.5})
Traceback (most recent call last):
...
fxmem.errors.InputError: compile= takes activation_memory_budget, mode, options; got budget
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ...errors import InputError

KEYS = ("activation_memory_budget", "mode", "options")
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class Compile:
    """How the step's model is compiled: ``activation_memory_budget`` (a fraction in (0, 1]
    of the activation memory the default partition saves; ``None``: as
    ``torch._functorch.config`` has it, 1.0 unless set), ``mode`` (``torch.compile``'s) and
    ``options`` (inductor options, as sorted ``(name, value)`` pairs)."""

    activation_memory_budget: float | None = None
    mode: str | None = None
    options: tuple = ()

    @classmethod
    def of(cls, value) -> Compile | None:
        """``None``/``False``: not compiled; ``True``: ``torch.compile``'s defaults; a dict
        with keys among :data:`KEYS`; a :class:`Compile`."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise InputError(f"compile= is True, False or a dict of {', '.join(KEYS)}; got "
                             f"{type(value).__name__}")
        unknown = sorted(set(value) - set(KEYS))
        if unknown:
            raise InputError(f"compile= takes {', '.join(KEYS)}; got {', '.join(unknown)}")
        budget = value.get("activation_memory_budget")
        if budget is not None and (isinstance(budget, bool) or not isinstance(
                budget, (int, float)) or not 0 < budget <= 1):
            raise InputError(f"activation_memory_budget is a fraction in (0, 1], got "
                             f"{budget!r}")
        mode, options = value.get("mode"), value.get("options") or {}
        if mode is not None and mode not in MODES:
            raise InputError(f"compile mode is one of {', '.join(MODES)}; got {mode!r}")
        if mode not in (None, "default", "max-autotune-no-cudagraphs"):
            raise InputError(f"compile mode {mode!r} runs the step as a CUDA graph, whose "
                             "memory pool fxmem does not model")
        if not isinstance(options, dict):
            raise InputError(f"compile options are a dict, got {type(options).__name__}")
        if mode is not None and options:
            raise InputError("torch.compile takes a mode or options, not both")
        return cls(None if budget is None else float(budget), mode,
                   tuple(sorted(options.items())))

    def apply(self, model):
        """``torch.compile(model)`` with these settings; a model compiled already is an
        :class:`fxmem.InputError` (the options would not reach its compiled code)."""
        from .inductor import is_compiled

        if is_compiled(model):
            raise InputError("compile= compiles the model: pass the model itself, not "
                             "torch.compile(model)")
        # its own recompile region: what fxmem compiles (on the trace's fakes, at its
        # settings) is never looked up by another torch.compile of the same code, nor counts
        # against its recompile limit
        return torch.compile(model, mode=self.mode, options=dict(self.options) or None,
                             isolate_recompiles=True)

    def blocks(self, model, paths) -> None:
        """Each module of ``model`` at ``paths`` compiled in place with these settings
        (``block.compile(...)``, as torchtitan compiles each transformer block): how
        ``compile=`` compiles a rank's model under a parallel strategy, before the strategy
        wraps it (``paths``: the strategy's ``compile_blocks``, the model's repeated
        blocks: :class:`fxmem.trace.parallel.strategy.Strategy`).

        >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> Compile().blocks(m, ["0"])
        >>> m[0]._compiled_call_impl is not None, m[1]._compiled_call_impl is None
        (True, True)
        """
        named = dict(model.named_modules())
        for path in paths:
            named[path].compile(mode=self.mode, options=dict(self.options) or None,
                                isolate_recompiles=True)

    def settings(self):
        """AOTAutograd's partitioner budget while the model compiles (restored on exit)."""
        from torch._functorch import config

        if self.activation_memory_budget is None:
            return contextlib.nullcontext()
        return config.patch(activation_memory_budget=self.activation_memory_budget)
