"""The JSON document's per-op timeline is converted only when asked for
(``Summary.to_dict(timeline=True)``): one row an op, its copy had been most of the
rendering of an LLM's report (0.33 s of Llama-3.1-8B's over 8 GPUs)."""

import dataclasses
import json

import torch

import fxmem
from fxmem.report.jsonout import render_json
from fxmem.report.summary import summarize


class _NotCopied:
    """A timeline row that fails when converted."""

    def __deepcopy__(self, memo):
        raise AssertionError("the timeline was converted")


def _summary():
    r = fxmem.analyze(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                          torch.nn.Linear(16, 2)),
                      torch.randn(4, 8), loss=lambda o: o.sum(), optimizer=torch.optim.SGD,
                      device="cpu")
    return summarize(r, B=16, budget_bytes=2**20)


def test_the_timeline_is_left_out_unconverted_unless_asked_for():
    s = _summary()
    doc = s.to_dict()
    assert "timeline" not in doc and s.timeline  # (the summary has one)
    assert dataclasses.replace(s, timeline=(_NotCopied(),)).to_dict() == doc
    assert json.loads(render_json(s)) == json.loads(json.dumps(doc))


def test_asked_for_the_timeline_comes_whole():
    s = _summary()
    doc = s.to_dict(timeline=True)
    assert doc["timeline"] == [list(t) for t in s.timeline]
    assert {k: v for k, v in doc.items() if k != "timeline"} == s.to_dict()
