"""The steps a fake-GPU test module measures, measured together: one child for all of them
(:func:`fxmem.validate.fakegpu.measure_steps`) at the first one asked for, since each child's
start (a CUDA build's import) costs more than most of these steps."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


class Steps:
    """``jobs()``: ``(function, kwargs)`` of the steps of ``module`` a test module measures
    (the first is measured again last, so that :meth:`first_and_last` can show that the
    others left nothing behind); ``env``: the child's environment. :meth:`get` gives one
    step's :class:`fxmem.validate.fakegpu.StepResult`, measured alone when it is not listed
    (or needs a smaller card, ``memory_bytes``)."""

    def __init__(self, module: str, jobs, env: dict | None = None):
        self.module, self.jobs, self.env, self._got = module, jobs, env, None

    def _all(self) -> list:
        from fxmem.validate.fakegpu import measure_steps

        if self._got is None:
            jobs = list(self.jobs())
            jobs += jobs[:1]
            got = measure_steps(sys.executable, [{"target": f"{self.module}:{f}", "kwargs": kw}
                                                 for f, kw in jobs],
                                sys_path=[HERE], env=self.env) if jobs else []
            self._got = [(f, kw, r) for (f, kw), r in zip(jobs, got)]
        return self._got

    def get(self, function: str, memory_bytes: int | None = None, **kwargs):
        from fxmem.validate.fakegpu import measure_step

        if memory_bytes is None:
            for f, kw, r in self._all():
                if (f, kw) == (function, kwargs):
                    return r
        return measure_step(sys.executable, f"{self.module}:{function}", kwargs=kwargs,
                            sys_path=[HERE], memory_bytes=memory_bytes, env=self.env)

    def first_and_last(self) -> tuple:
        """((function, kwargs), its figures measured first, measured last, measured alone):
        each figure ``(baseline_allocated, baseline_reserved, max_allocated, max_reserved,
        end_allocated, end_reserved)``."""
        from fxmem.validate.fakegpu import measure_step

        (f, kw, first), *_, (_, _, last) = self._all()
        alone = measure_step(sys.executable, f"{self.module}:{f}", kwargs=kw,
                             sys_path=[HERE], env=self.env)
        return (f, kw), *[(r.baseline_allocated, r.baseline_reserved, r.max_allocated,
                           r.max_reserved, r.end_allocated, r.end_reserved)
                          for r in (first, last, alone)]


def set_back() -> None:
    """In a fake-GPU child, after a measured step: the process as a fresh one starts the
    next (the step's tensors collected, the cuBLAS workspaces it kept let go, every cached
    segment returned, the peaks reset), as ``measure_steps`` does between its jobs."""
    from fxmem.validate.fakegpu._child import _release

    _release({})
