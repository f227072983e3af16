"""A new user's first hour (issue 40): each thing that stopped or misled a user trying the
README from a fresh clone, checked at its cause.

B = 1 takes other paths in some kernels, so the formulas hold from B = 2 (``valid_when``);
a report asked at B = 1 traces the step with B the int 1 and answers from that trace, and
every figure at B = 1 is checked against a real eager step."""

import json
import os
import sys

import pytest
import torch

import fxmem
from fxmem.cli.families import torchvision_release
from fxmem.report.capacity import MaxBatchSize
from fxmem.report.summary import summarize
from fxmem.report.text import fmt_share
from test_mistakes import run_in_process

TINY_GPT2 = ["--config", "n_layer=1", "--config", "n_embd=64", "--config", "n_head=2",
             "--config", "vocab_size=512", "--config", "n_positions=128"]


class Transposed(torch.nn.Module):
    """``contiguous()`` after a transpose copies for every B but 1: at B = 1 the transposed
    tensor is already contiguous (a size-1 dim's stride does not count), so the formula,
    which holds from B = 2, is above the real step there."""

    def __init__(self, width=64):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x):
        return self.fc(x.transpose(0, 1).contiguous())


def _step(**kw):
    return {"loss": lambda o: o.sum(), "optimizer": torch.optim.SGD, **kw}


@pytest.fixture(scope="module")
def transposed():
    m, x = Transposed(), torch.randn(4, 16, 64)
    return m, x, fxmem.analyze(m, x, **_step(device="cpu"))


def test_b1_is_traced_at_b1_and_exact(transposed):
    m, x, r = transposed
    assert r.min_batch_size == 2  # the formula holds from B = 2
    measured = fxmem.measure(m, x, **_step(), B=1).peak_bytes
    assert r.liveness.peak_bytes(1) > measured  # the formula at B = 1 is not the step
    assert r.peak_bytes(1) == measured
    assert r.breakdown(1).peak_bytes == measured
    assert max(p.live_bytes for p in r.timeline(1)) == measured
    assert r.peak_bytes(2) == fxmem.measure(m, x, **_step(), B=2).peak_bytes


def test_only_b1_fits(transposed):
    _, _, r = transposed
    one = r.peak_bytes(1)
    got = r.max_batch_size(one)
    assert (int(got), got.by) == (1, "live")
    with pytest.raises(fxmem.InfeasibleBudgetError, match="at B=1"):
        r.max_batch_size(one - 1)


def test_only_b1_fits_on_the_device():
    m, x = Transposed(1024), torch.randn(4, 1024, 1024)  # 4 MiB a sample
    r = fxmem.analyze(m, x, **_step())
    run = r.runs_on_device(1, 2**40)
    budget = run.max_reserved
    assert not r.runs_on_device(2, budget).fits and r.runs_on_device(1, budget).fits
    assert int(r.max_batch_size(budget)) == 1
    allocated = r.cuda_memory(1).max_allocated
    assert r.cuda_memory(2).max_allocated > allocated
    assert r.max_batch_size(allocated, by="allocated") == 1


def test_b1_in_named_dims():
    from transformers import GPT2Config, GPT2LMHeadModel

    from fxmem.validate.zoo import CausalLM

    cfg = GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=512, n_positions=128,
                     bos_token_id=0, eos_token_id=0)
    model = CausalLM(GPT2LMHeadModel(cfg))
    ids = torch.randint(0, 512, (2, 32))
    r = fxmem.analyze(model, (ids, ids), **_step(device="cpu", loss=None),
                      dims={"L": [(0, 1), (1, 1)]})
    assert r.min_batch_size == 2
    for length in (16, 32):
        x = torch.randint(0, 512, (1, length))
        assert r.peak_bytes(1, L=length) == fxmem.measure(
            model, (x, x), **_step(loss=None), B=1).peak_bytes
    budget = r.peak_bytes(1, L=40)
    assert r.max_length(budget, 1) == 40
    assert r.at(L=32).peak_bytes(1) == r.peak_bytes(1, L=32)


def test_cli_b1_on_a_card_gives_the_whole_report(capfd):
    code, out, err = run_in_process(["analyze", "hf:gpt2", *TINY_GPT2, "--gpu", "H100",
                                     "--batch", "1", "--format", "json"], capfd)
    assert code == 0, err
    d = json.loads(out)
    assert d["B"] == 1 and d["max_batch_size"] > 1
    assert d["setup"]["largest L within the budget at B=1"] == 128


def test_an_inference_report_speaks_of_inference(capfd):
    argv = ["analyze", "hf:bert", "--config", "num_hidden_layers=1", "--config",
            "hidden_size=64", "--config", "num_attention_heads=2", "--config",
            "intermediate_size=128", "--inference", "--amp", "bf16", "--gpu", "T4",
            "--format", "json"]
    code, out, err = run_in_process(argv, capfd)
    assert code == 0, err
    d = json.loads(out)
    assert d["setup"]["step"] == "inference"
    assert d["setup"]["inputs"].count("B,L") == 1  # the ids, no labels: no loss
    assert "nll_loss" not in d["peak_op"] and "loss" not in json.dumps(d["by_module"])
    assert "dropout" not in d["setup"].get("CUDA kernels", "")  # eval mode
    code, out, _ = run_in_process(argv[:-2], capfd)
    assert "its inference steps" in " ".join(out.split()) and "training" not in out


def test_a_piped_rank_table_is_never_cut(capfd):
    """Not a terminal: rich prints 80 columns; the per-rank table turns when it is wider."""
    code, out, err = run_in_process(["analyze", "examples/resnet18.py:ResNet18", "--input",
                                     "B,3,32,32", "--target", "B:int64:10", "--optimizer",
                                     "adam", "--fsdp", "3", "--budget", "8GiB"], capfd)
    assert code == 0, err
    lines = out.splitlines()
    assert max(map(len, lines)) <= 80
    start = next(i for i, s in enumerate(lines) if s.startswith("Per rank"))
    table = "\n".join(lines[start:start + 16])
    for word in ("optimizer state", "activations", "buffers", "largest B", "0, 1 *"):
        assert word in table, (word, table)


def test_a_shape_mistake_is_the_models(tmp_path, capfd):
    (tmp_path / "net.py").write_text(
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(63, 10)\n"
        "    def forward(self, x):\n"
        "        return self.fc2(torch.relu(self.fc1(x)))\n")
    code, out, err = run_in_process(["analyze", f"{tmp_path}/net.py:Net", "--input", "B,32",
                                     "--target", "B:int64:10"], capfd)
    assert code == 3 and out == ""
    assert err.startswith("fxmem: error: the model fails at this op, as eager PyTorch would")
    assert "module fc2" in err and "net.py:7 in forward" in err
    with pytest.raises(fxmem.ModelError, match="as eager PyTorch would"):
        fxmem.analyze(torch.nn.Linear(3, 2), torch.randn(4, 5), loss=lambda o: o.sum(),
                      device="cpu")


def test_a_fake_tensor_limit_is_not_blamed_on_the_model():
    from fxmem.trace.engine.messages import fails_in_eager

    a, b = torch.empty(2, 64), torch.empty(63, 10)
    assert fails_in_eager(torch.ops.aten.mm.default, (a, b), {}, None, RuntimeError())
    assert not fails_in_eager(torch.ops.aten.mm.default, (a, b), {}, None,
                              NotImplementedError())  # what only the trace cannot do
    assert not fails_in_eager(torch.ops.aten.mm.default, (a, b.new_empty(64, 10)), {}, None,
                              RuntimeError())  # fine in eager: the trace's own failure


def test_a_hub_id_says_what_to_give(capfd):
    code, out, err = run_in_process(["analyze", "hf:meta-llama/Llama-3.1-8B", "--batch", "1"],
                                    capfd)
    assert code == 2, err
    assert "Hugging Face Hub id" in err and "downloads nothing" in err
    assert "hf download meta-llama/Llama-3.1-8B config.json" in err


def test_a_hub_id_in_the_local_cache_is_used(tmp_path, monkeypatch, capfd):
    """A config the Hub cache already holds is read from there: nothing is downloaded."""
    import huggingface_hub.constants as hc

    snap = tmp_path / "models--someone--tiny-gpt2" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (tmp_path / "models--someone--tiny-gpt2" / "refs").mkdir()
    (tmp_path / "models--someone--tiny-gpt2" / "refs" / "main").write_text("abc123")
    (snap / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "n_layer": 1, "n_embd": 64, "n_head": 2, "vocab_size": 512,
         "n_positions": 128}))
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path))
    code, out, err = run_in_process(["analyze", "hf:someone/tiny-gpt2", "--device", "cpu",
                                     "--format", "json"], capfd)
    assert code == 0, err
    assert json.loads(out)["parts_formulas"]["params"]


def _has_timm() -> bool:
    import importlib.util

    return importlib.util.find_spec("timm") is not None


@pytest.mark.parametrize("package", ["torchvision", pytest.param("timm", marks=pytest.mark.skipif(
    not _has_timm(), reason="timm is not installed (tests/realmodels' environment has it)"))])
def test_a_torchvision_that_does_not_load_says_which_to_install(package, tmp_path,
                                                                 monkeypatch, capfd):
    """PyPI's torchvision beside a CPU build of torch fails as it loads; the message names
    the release made for this torch."""
    fake = tmp_path / "torchvision"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "raise RuntimeError('operator torchvision::nms does not exist')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0] in ("torchvision", "timm")]:
        monkeypatch.delitem(sys.modules, name)
    code, out, err = run_in_process(["analyze", f"{package}:resnet50"], capfd)
    assert code == 2, err
    assert "does not load beside torch" in err and "operator torchvision::nms" in err
    assert f"torchvision=={torchvision_release()}.*" in err
    assert "README" in err


@pytest.mark.skipif(_has_timm(), reason="timm is installed")
def test_timm_missing_names_the_torchvision_too(capfd):
    code, _, err = run_in_process(["analyze", "timm:resnet50"], capfd)
    assert code == 2 and "timm: targets need timm: pip install timm" in err
    assert f"torchvision=={torchvision_release()}.*" in err


def test_torchvision_release_matches_the_readme():
    """The README's second environment pins the pair this rule names."""
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    assert "torch==2.14.1 torchvision==0.29.1" in readme
    assert torchvision_release() == f"0.{int(torch.__version__.split('.')[1]) + 15}"


def test_readable_segments_and_plans():
    m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(),
                                                  torch.nn.Linear(32, 8)) for _ in range(3)])
    r = fxmem.analyze(m, torch.randn(4, 8), **_step(device="cpu"))
    assert repr(r).startswith("<fxmem.Report in B on cpu: peak Max(") and "B >= 2>" in repr(r)
    text = repr(r.segments)
    assert text.splitlines()[0].endswith("(released_bytes: what a checkpoint frees):")
    assert len(text.splitlines()) == len(r.segments) + 1 and "Segment(" not in text
    plan = fxmem.Plan.of(["1", fxmem.Region(("0",), save=tuple(
        ("aten.addmm.default", i) for i in range(30)))])
    assert repr(plan) == "<Plan: 0 (saving 30 op outputs), 1>"
    assert plan[1] == "1" and len(plan.regions[0].save) == 30  # the data is all there
    assert repr(plan[0]) == "<Region 0 (saving 30 op outputs)>"


def test_max_batch_size_has_one_return_type():
    m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                                                  torch.nn.Linear(256, 64)) for _ in range(4)])
    r = fxmem.analyze(m, torch.randn(4, 64), **_step(device="cpu"))
    budget = r.peak_bytes(512)
    plain = r.max_batch_size(budget)
    planned = r.max_batch_size(budget, max_recompute=0.5)
    assert type(plain) is type(planned) is MaxBatchSize
    assert plain.plan == () and plain.choice is None
    assert int(planned) > int(plain) and planned.plan and planned.B == int(planned)
    assert planned.peak_bytes <= budget and 0 < planned.recompute_fraction <= 0.5
    assert "with checkpoint plan" in planned.explain
    # the share as every other line gives it (report.text.fmt_share: a tenth of a per cent)
    assert f"re-running {fmt_share(planned.recompute_fraction)} of" in planned.explain
    with pytest.raises(AttributeError, match="no checkpoint plan"):
        plain.peak_bytes


def test_the_plot_marks_the_largest_b_on_the_curve_it_is_read_from():
    from fxmem.report.plots import peak_vs_batch
    from fxmem.validate.zoo import SeedCNN

    r = fxmem.analyze(SeedCNN(), torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)),
                      loss=torch.nn.functional.cross_entropy, optimizer=torch.optim.Adam)
    s = summarize(r, B=64, budget_bytes=8 * 2**30)
    assert s.max_batch_size_by == "device" and s.cuda_curve
    reserved = {b: res for b, _, res in s.cuda_curve}
    most = s.max_batch_size
    assert reserved[most] == r.cuda_memory(most).max_reserved
    assert reserved[most] > dict(s.curve)[most]  # well above the live bytes
    fig = peak_vs_batch(s)
    ax = fig.axes[0]
    unit = 2**30
    marker = next(ln for ln in ax.get_lines() if ln.get_marker() == "D")
    assert marker.get_ydata()[0] * unit == pytest.approx(reserved[most], rel=1e-12)
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert "max_memory_reserved" in labels and "max_memory_allocated" in labels


def test_nothing_fits_still_gives_the_report(capfd):
    """Nothing fits 1 MiB: the report still comes, saying by how much and what fxmem searched
    (a checkpoint plan, FSDP2 ranks), with one line on stderr and exit 4 for scripts."""
    code, out, err = run_in_process(["analyze", "examples/seed_convnet.py:SimpleConvNet",
                                     "--input", "B,3,32,32", "--target", "B:int64:10",
                                     "--optimizer", "adam", "--budget", "1MiB"], capfd)
    assert code == 4 and err.count("\n") == 1
    assert err.startswith("fxmem: B=32 does not fit 1.00 MiB: it needs ")
    assert "nothing fxmem searched makes it fit" in err
    assert "B = 32 does not fit" in out and "Parts" in out
    assert "no checkpoint plan fits at B=32" in out and "under FSDP2" in out
