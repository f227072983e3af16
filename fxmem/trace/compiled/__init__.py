"""Compiled models (``torch.compile``): inductor's own code run on the trace's fake tensors.

- :mod:`~fxmem.trace.compiled.inductor`: the compiled graphs lowered for the GPU and their
  Python wrappers run on the fakes (each buffer, each ``del``);
- :mod:`~fxmem.trace.compiled.parts`: modules compiled on their own (``torch.compile(block)``,
  ``block.compile()``), each lowered so, the eager code between them traced as any step's;
- :mod:`~fxmem.trace.compiled.options`: :class:`Compile`, the options ``compile=`` takes.

A change here must keep the compiled steps exact against the same step run on the fake GPU
(``tests/test_fake_gpu_compile.py``).
"""

from .inductor import check_compilable, is_compiled
from .options import Compile
from .parts import check_lowerable, check_parts, compiled_parts, in_place_context, named_parts

__all__ = ["Compile", "check_compilable", "check_lowerable", "check_parts", "compiled_parts",
           "in_place_context", "is_compiled", "named_parts"]
