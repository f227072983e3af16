"""JSON rendering of a :class:`fxmem.report.summary.Summary`; the document's fields are
described in ``docs/json-schema.md`` (schema ``fxmem.report/2``:
:data:`fxmem.report.summary.SCHEMA`).

>>> import json, torch, fxmem
>>> from fxmem.report.summary import summarize
>>> r = fxmem.analyze(torch.nn.Linear(8, 2), torch.randn(4, 8), train=False, device="cpu")
>>> json.loads(render_json(summarize(r, B=3)))["peak_bytes"] == r.peak_bytes(3)
True
"""

from __future__ import annotations

import json


def render_json(s, timeline: bool = False) -> str:
    """The summary as indented JSON, keys in a fixed order; ``timeline``: include the live
    bytes after every op."""
    return json.dumps(s.to_dict(timeline=timeline), indent=2) + "\n"
