"""A report's confirmation trace (``retrace``: a checkpoint plan -> the step traced with it)
as a report at values of its named dims has it (:meth:`fxmem.Report.at`,
:meth:`fxmem.ParallelReport.at`): the step traced, then read at those values; a trace at one
point (``point=(B, {dim: size})``) made at those values too."""

from __future__ import annotations


def retrace_at(retrace, values: dict):
    """``retrace`` (``(plan, ..., point=None) -> a report in named dims``) as the report at
    ``values`` of them has it, or None.

    >>> class Traced:
    ...     def __init__(self, plan, point): self.plan, self.point = plan, point
    ...     def at(self, **values): return self.plan, self.point, values
    >>> at = retrace_at(lambda plan, point=None: Traced(plan, point), {"L": 64})
    >>> at("block"), at("block", point=(2, {}))
    (('block', None, {'L': 64}), ('block', (2, {'L': 64}), {'L': 64}))
    """
    if retrace is None:
        return None

    def at(plan, *args, point=None, **options):
        if point is not None:
            point = (point[0], {**point[1], **values})
        return retrace(plan, *args, point=point, **options).at(**values)
    return at
