"""What a report's peak leaves out or takes at its largest: :attr:`fxmem.Report.unmodelled`."""

from __future__ import annotations


def unmodelled(report) -> tuple:
    """``(op, module, what)``: the trace's unmodelled allocations, then its storages sized by
    the data, each saying whether it is live where the peak can be."""
    t = report.trace
    return t.unmodelled + tuple((op, m, what + _at_peak(report, op, m))
                                for op, m, what in t.data_sized)


def _at_peak(report, op: str, module: str) -> str:
    if report.liveness is None:  # in named dims: ask report.at(...)
        return ""
    storages, ops = report.trace.storages, report.trace.ops
    mine = {s.sid for s in storages if s.data_bound and s.created_by >= 0
            and ops[s.created_by].op == op and s.module == module}
    if any(mine.intersection(report.liveness.live_sids(c.op_index))
           for c in report.liveness.candidates):
        return "; live where the peak can be, which is then an upper bound"
    return "; never live where the peak can be, which is exact whatever the count"
