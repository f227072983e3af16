"""Checks a step makes on its data, assumed to pass.

Model code validates its inputs with the values of tensors: Hugging Face XLM's
``assert lengths.max().item() <= slen``, ``if input_ids.max() >= vocab_size: raise
ValueError(...)``, ``torch._assert(...)``. Fake tensors have no values, so PyTorch cannot
decide such a condition (``GuardOnDataDependentSymNode``), yet its outcome changes no memory:
either the check passes and the step goes on, or the step raises and there is no step to
predict. So where the undecidable condition is the test of an ``assert`` statement, or of an
``if`` whose body only raises, or the condition of ``torch._assert``,
:class:`CheckingShapeEnv` takes the outcome under which the step goes on, and records the
line (the report lists it in ``Report.unmodelled``). Any other branch on data is still
refused (:mod:`fxmem.trace.kernels.datadep`).

The outcome is read from the statement's syntax (Python's :mod:`ast` of the source file):
an ``assert`` needs its test true, an ``if ...: raise`` needs it false; ``not`` flips that,
``and`` in an ``assert`` and ``or`` in an ``if ...: raise`` pass it to each operand. Where
it is ambiguous (``if a and b: raise``) the branch is refused.

>>> outcome_at_line("assert n <= 16", 1)
True
>>> outcome_at_line("if not (n <= 16):\\n    raise ValueError(n)", 1)
True
>>> outcome_at_line("if n > 16 and m > 2:\\n    raise ValueError(n)", 1) is None
True
"""

from __future__ import annotations

import ast
import functools
import linecache
import sys

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import (
    GuardOnDataDependentSymNode,
    ShapeEnv,
    uninteresting_files,
)

from .datadep import internal_file

_TORCH_ASSERT = torch._assert.__code__  # torch._assert(condition, message): an assert


def _wanted(test: ast.expr, want: bool) -> bool | None:
    """The value the one undecided condition inside ``test`` must take for ``test`` to be
    ``want``; ``None`` where that depends on which operand is undecided."""
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, want = test.operand, not want
    if isinstance(test, ast.BoolOp):
        # every operand of `and` true, every operand of `or` false: each has one outcome
        if (isinstance(test.op, ast.And) and want) or (isinstance(test.op, ast.Or) and not want):
            outcomes = {_wanted(v, want) for v in test.values}
            return outcomes.pop() if len(outcomes) == 1 else None
        return None
    return want


def _only_raises(body: list[ast.stmt]) -> bool:
    return len(body) == 1 and isinstance(body[0], ast.Raise)


@functools.lru_cache(maxsize=64)
def _tree(source: str) -> ast.AST | None:
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def outcome_at_line(source: str, lineno: int) -> bool | None:
    """The outcome a condition evaluated at ``lineno`` of ``source`` must have for the step
    to go on, when that line is in the test of an ``assert`` or of an ``if`` that only
    raises; else ``None``."""
    tree = _tree(source)
    if tree is None:
        return None
    found = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            test, want = node.test, True
        elif isinstance(node, ast.If) and _only_raises(node.body) and not node.orelse:
            test, want = node.test, False
        else:
            continue
        if test.lineno <= lineno <= (test.end_lineno or test.lineno):
            found = (test, want)  # ast.walk is breadth first: the innermost comes last
    return _wanted(*found) if found else None


def _caller() -> tuple[str, int, bool] | None:
    """(file, line, in ``torch._assert``) of the innermost frame that is neither torch's,
    fxmem's nor the standard library's: the model code evaluating the condition."""
    f = sys._getframe(2)
    in_assert = False
    while f is not None:
        if not internal_file(f.f_code.co_filename):
            return f.f_code.co_filename, f.f_lineno, in_assert
        in_assert = in_assert or f.f_code is _TORCH_ASSERT
        f = f.f_back
    return None


class CheckingShapeEnv(ShapeEnv):
    """A ShapeEnv that lets a check on data pass (see the module docstring). ``assumed``:
    the checks it let pass, as ``file:line: source``, in order."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.assumed: list[str] = []

    def _get_user_frame(self):
        # where a guard was made (its ``framework_loc``, which fxmem's errors and the lifted
        # trace's note name): the first frame past torch's and this file's own
        frame, skip = sys._getframe(1), uninteresting_files() | {__file__}
        while frame is not None and frame.f_code.co_filename in skip:
            frame = frame.f_back
        return frame

    def evaluate_expr(self, orig_expr, *args, **kwargs):
        try:
            return super().evaluate_expr(orig_expr, *args, **kwargs)
        except GuardOnDataDependentSymNode:
            where = _caller()
            if where is None:
                raise
            filename, lineno, in_assert = where
            text = "".join(linecache.getlines(filename))
            outcome = True if in_assert else outcome_at_line(text, lineno) if text else None
            if outcome is None:
                raise
            line = linecache.getline(filename, lineno).strip()
            note = f"{filename}:{lineno}: {line}"
            if note not in self.assumed:
                self.assumed.append(note)
            return sympy.true if outcome else sympy.false
