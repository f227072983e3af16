"""A new user's mistakes, written by someone who had read only the README, the CLI's help and
the examples, before the fixes of issue 22 were known to them (``mistakes_models/heldout.json``:
118 cases, with what they expected and the words a good message must contain), and what
stopped a new user in their first hour (issue 40: the ``first-hour-*`` cases, with the words a
full report must hold, ``expect_out``). Each is run
here as ``test_mistakes.py`` runs the team's own: one line on stderr, the expected exit code,
no traceback, no torch log line, global state unchanged (a budget nothing fits: exit 4, the
report on stdout and one line on stderr saying by how much).

Where fxmem deliberately answers otherwise than the case expected, :data:`ADJUDICATED` says
what it does instead and why; the case is checked against that."""

import json
import os

import pytest

import fxmem
from test_mistakes import TORCH_LOG, run_in_process

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = json.load(open(os.path.join(HERE, "mistakes_models", "heldout.json"), encoding="utf-8"))

# id -> (exit code or "ok"/"error" for the API, why fxmem's answer differs from the case's)
ADJUDICATED = {
    "spec-dtype-fp16": (3, "a float16 input into float32 weights cannot be traced, like a wrong "
                           "image size (exit 3); the message names the dtypes and --amp"),
    "spec-dtype-torch-long": (0, "torch's own name torch.long is accepted, as the case's note "
                                 "allows"),
    "amp-float16": (0, "--amp takes torch's names too (issue 22: one table of dtype names)"),
    "api-amp-string": ("ok", "amp='fp16' is accepted, as the case's note allows"),
    "api-budget-float": ("error", "budget_bytes is an int number of bytes, as B is an int; the "
                                  "message says to write int(8e9) or 8 * 2**30"),
}


def _expected(case):
    if case["id"] in ADJUDICATED:
        return ADJUDICATED[case["id"]][0]
    if case["kind"] == "api":
        return "ok" if case["expect_exit"] == 0 else "error"
    return case["expect_exit"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_a_new_users_mistake(case, tmp_path, monkeypatch, capfd):
    for rel, text in case.get("files", {}).items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    want = _expected(case)
    if case["kind"] == "cli":
        code, out, err = run_in_process(case["argv"], capfd)
        assert code == want, (code, err)
        assert "Traceback" not in err and not TORCH_LOG.search(err), err
        if want == 4:  # nothing fits: the report still comes, and one line says so
            assert err.startswith("fxmem: B=") and err.count("\n") == 1, err
            assert "does not fit" in err and "does not fit" in out, out
            msg = err
        elif want != 0:
            assert err.startswith("fxmem: error: ") and err.count("\n") == 1, err
            assert out == "", out
            msg = err
        flat = " ".join(out.split())  # the report, however the terminal wrapped it
        missing = [w for w in case.get("expect_out", ()) if " ".join(w.split()) not in flat]
        assert not missing, (missing, out)
    else:
        try:
            exec(compile(case["code"], f"{case['id']}.py", "exec"), {"__name__": "__main__"})
            raised = None
        except fxmem.FxmemError as e:
            raised = e
        if want == "ok":
            assert raised is None, raised
        else:
            assert raised is not None, "no error"
            msg = str(raised)
            assert "\n" not in msg.strip(), msg
    if want not in (0, "ok") and case["id"] not in ADJUDICATED:
        missing = [k for k in case["keywords"] if k.lower() not in msg.lower()]
        assert not missing, (missing, msg)
