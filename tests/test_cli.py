"""The fxmem command through its real entry points (the console script and python -m fxmem),
its outputs against golden files (pytest --update-golden rewrites them), and every error
path with its exit code."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FXMEM = os.path.join(os.path.dirname(sys.executable), "fxmem")
SEED = ["examples/seed_convnet.py:SimpleConvNet", "--input", "B,3,32,32", "--target",
        "B:int64:10", "--optimizer", "adam", "--batch", "64"]


def run(*args, module=False, **kw):
    cmd = [sys.executable, "-m", "fxmem", *args] if module else [FXMEM, *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, **kw)


def test_markdown_report_is_golden(golden):
    r = run("analyze", *SEED, "--budget", "8GiB", "--format", "md")
    assert r.returncode == 0, r.stderr
    golden("seed_cnn.md", r.stdout)


def test_json_report_is_golden_and_matches_the_library(golden):
    import torch
    import torch.nn.functional as F

    import fxmem

    r = run("analyze", *SEED, "--budget", "8GiB", "--format", "json", module=True)
    assert r.returncode == 0, r.stderr
    golden("seed_cnn.json", r.stdout)
    doc = json.loads(r.stdout)
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from seed_convnet import seed_step

    model, x, y = seed_step()
    rep = fxmem.analyze(model, x, y, loss=F.cross_entropy, optimizer=torch.optim.Adam)
    assert doc["schema"] == "fxmem.report/2"
    assert doc["peak_formula"] == str(rep.peak)
    assert doc["peak_bytes"] == rep.peak_bytes(64)
    assert doc["max_batch_size"] == rep.max_batch_size(8 * 2**30)
    assert doc["max_batch_size_by"] == "device"
    assert doc["answers"]["live"] == rep.max_batch_size(8 * 2**30, by="live")


def test_table_html_and_out_file(tmp_path):
    r = run("analyze", *SEED, "--budget", "24GiB")
    assert r.returncode == 0, r.stderr
    assert "Largest B within 24.00 GiB" in r.stdout and "Peak memory" in r.stdout
    out = tmp_path / "report.html"
    r = run("analyze", *SEED, "--budget", "8GiB", "--format", "html", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_text().lstrip().lower().startswith("<!doctype html")
    assert f"wrote {out}" in r.stderr
    table = tmp_path / "report.txt"  # the table format to a file: plain text, no colour codes
    r = run("analyze", *SEED, "--budget", "8GiB", "--out", str(table))
    assert r.returncode == 0, r.stderr
    assert "Peak memory" in table.read_text() and "\x1b[" not in table.read_text()


def test_checkpoint_auto_and_paths():
    args = ["tests/zoo.py:ResNetish", "--input", "B,3,8,8", "--target", "B:int64:10",
            "--optimizer", "sgd", "--device", "cpu", "--batch", "64", "--format", "json"]
    auto = json.loads(run("analyze", *args, "--checkpoint", "auto").stdout)
    assert auto["plan"] and auto["frontier"]
    given = json.loads(run("analyze", *args, "--checkpoint", "layer1.0,layer1.1").stdout)
    assert given["plan"] == ["layer1.0", "layer1.1"]
    assert given["peak_bytes"] <= json.loads(run("analyze", *args).stdout)["peak_bytes"]


def test_save_plan_and_load_it(tmp_path):
    """--save-plan writes the plan --checkpoint auto chose (a selective one here); given back
    with --checkpoint PLAN.json it gives the same report, and fxmem.load_plan reads it."""
    import fxmem

    f = tmp_path / "plan.json"
    args = ["tests/zoo.py:ResNetish", "--input", "B,3,8,8", "--target", "B:int64:10",
            "--optimizer", "sgd", "--device", "cpu", "--batch", "64", "--format", "json"]
    r = run("analyze", *args, "--checkpoint", "auto", "--save-plan", str(f))
    assert r.returncode == 0, r.stderr
    auto = json.loads(r.stdout)
    plan = fxmem.load_plan(str(f))
    assert [str(e) for e in plan] == auto["plan"] and plan
    again = json.loads(run("analyze", *args, "--checkpoint", str(f)).stdout)
    assert again["peak_bytes"] == auto["peak_bytes"] and again["plan"] == auto["plan"]
    r = run("analyze", *args, "--save-plan", str(tmp_path / "no" / "plan.json"))
    assert r.returncode == 2 and "--save-plan" in r.stderr and "no such folder" in r.stderr


def test_whatif_rows():
    r = run("analyze", *SEED, "--budget", "8GiB", "--whatif", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = {w["method"]: w for w in json.loads(r.stdout)["whatifs"]}
    assert list(rows) == ["baseline", "smaller batch", "mixed precision",
                          "gradient accumulation", "no_grad evaluation", "checkpointing"]
    assert rows["mixed precision"]["peak_bytes"] < rows["baseline"]["peak_bytes"]
    r = run("analyze", *SEED, "--whatif")
    assert r.returncode == 2 and "--whatif compares training setups" in r.stderr


def test_cudnn_workspace_is_held_by_each_convolution():
    plain = json.loads(run("analyze", *SEED, "--format", "json").stdout)["cuda"]
    r = run("analyze", *SEED, "--cudnn-workspace", "256MiB", "--budget", "8GiB",
            "--format", "json")
    assert r.returncode == 0, r.stderr
    capped = json.loads(r.stdout)["cuda"]
    assert capped["workspaces"][-1] == ["cuDNN workspace per convolution call (freed after it)",
                                        256 * 2**20]
    assert plain["max_allocated"] < capped["max_allocated"] <= plain["max_allocated"] + 256 * 2**20
    assert capped["max_batch_size"] is not None


def test_hf_preset_with_config_overrides():
    r = run("analyze", "hf:gpt2", "--config", "n_layer=1", "--config", "n_embd=64",
            "--config", "n_head=2", "--seq", "32", "--optimizer", "adamw", "--batch", "4",
            "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    # the preset traces the length as a symbol L; the numbers are at --seq
    assert doc["setup"]["inputs"] == "B,L:int64:50257 B,L:int64:50257"
    assert doc["setup"]["dim L"] == 32 and "B*L" in doc["setup"]["peak in B, L"]
    assert doc["parts_bytes"]["params"] > 0 and doc["peak_bytes"] > 0
    assert "loss_type" not in r.stderr  # transformers' warning: the preset names its loss
    fixed = run(*r.args[r.args.index("analyze"):], "--input", "B,32:int64:50257",
                "--input", "B,32:int64:50257")  # the same step traced at a fixed length
    assert fixed.returncode == 0, fixed.stderr
    assert json.loads(fixed.stdout)["peak_bytes"] == doc["peak_bytes"]


@pytest.mark.parametrize("args,code,message", [
    (["analyze", "nope.py:Model", "--input", "B,3"], 2, "no such file: nope.py"),
    (["analyze", "examples/seed_convnet.py:Nope", "--input", "B,3"], 2, "has no Nope"),
    (["analyze", "justaname"], 2, "TARGET is path/to/file.py:Name"),
    (["analyze", "hf:nosuch"], 2, "unknown preset hf:nosuch"),
    (["analyze", "hf:gpt2", "--config", "n_layer"], 2, "--config takes key=value"),
    (["analyze", *SEED, "--budget", "3XB"], 2, "not a size: '3XB'"),
    (["analyze", "examples/seed_convnet.py:SimpleConvNet", "--input", "B,3,B"], 2,
     "B (the batch) may stand at one dim only"),
    (["analyze", "examples/seed_convnet.py:SimpleConvNet", "--input", "3,32,32"], 2,
     "no --input/--target spec has B"),
    (["analyze", "examples/seed_convnet.py:SimpleConvNet", "--input", "B,3:float7"], 2,
     "unknown dtype 'float7'"),
    (["analyze", "examples/seed_convnet.py:SimpleConvNet"], 2, "give the model's inputs"),
    (["analyze", *SEED, "--inference"], 2, "--inference runs no backward pass"),
    (["analyze", *SEED, "--bogus"], 2, "No such option '--bogus'"),
    (["analyze", *SEED, "--optimizer", "adamx"], 2, "Invalid value for '--optimizer'"),
    (["analyze"], 2, "Missing argument 'TARGET'"),
    (["analyze", "examples/seed_convnet.py:SimpleConvNet", "--input", "B,3,31"], 3,
     "the model fails at this op, as eager PyTorch would"),
    (["analyze", *SEED, "--device", "cpu", "--cudnn-workspace", "1MiB"], 2,
     "--cudnn-workspace is a CUDA figure"),
])
def test_errors_are_one_line_with_an_exit_code(args, code, message):
    r = run(*args)
    assert r.returncode == code, (r.returncode, r.stderr)
    assert message in r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert r.stderr.startswith("fxmem: error: ")


def test_debug_shows_the_traceback():
    r = run("analyze", "examples/seed_convnet.py:SimpleConvNet", "--input", "B,3,31", "--debug")
    assert r.returncode == 3
    assert "Traceback" in r.stderr and "fxmem: error:" in r.stderr.strip().splitlines()[-1]


def test_help_and_version():
    r = run("--help", module=True)
    assert r.returncode == 0 and "analyze" in r.stdout
    r = run("--version")
    assert r.returncode == 0 and "0.1.0" in r.stdout


def test_the_collector_is_paced_while_a_command_runs(monkeypatch, capsys):
    """Full collections are rarer while a command analyses (fxmem.cli.collector) and while
    it writes its report out (rendering after the objects were unfrozen, the 8B one-GPU
    command's full passes had walked every trace it made: 1.45 s of them), and the
    process's thresholds are as they were once it is done, nothing left frozen."""
    import gc

    from fxmem.cli import command
    from fxmem.cli.collector import FULL_EVERY

    seen, written, real, echo = [], [], command._analyze, command.click.echo

    def recording(*args, **kwargs):
        seen.append(gc.get_threshold())
        return real(*args, **kwargs)

    def writing(*args, **kwargs):
        written.append((gc.get_threshold(), gc.get_freeze_count()))
        return echo(*args, **kwargs)

    monkeypatch.setattr(command, "_analyze", recording)
    monkeypatch.setattr(command.click, "echo", writing)
    monkeypatch.chdir(ROOT)
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with pytest.raises(SystemExit) as done:
        command.main(["analyze", *SEED, "--format", "json"])
    assert done.value.code in (0, None), capsys.readouterr().err
    assert seen and seen[0][2] >= FULL_EVERY > before[2] and gc.get_threshold() == before
    assert written and all(t[2] >= FULL_EVERY and n > frozen for t, n in written)
    assert gc.get_freeze_count() == frozen


def test_a_table_does_not_import_the_html_report_s_plotting():
    """The terminal's table needs no matplotlib (the HTML report's plots import it: about
    a third of a second of every command's start)."""
    code = ("import sys\nfrom fxmem.cli.command import main\n"
            f"try:\n    main(['analyze', *{SEED!r}, '--device', 'cpu'])\n"
            "except SystemExit:\n    pass\nprint('matplotlib' in sys.modules, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert "Peak memory" in r.stdout and r.stderr.strip().splitlines()[-1] == "False", r.stderr


@pytest.mark.parametrize("ends, code, err", [("sys.exit(4)", 4, ""),
                                             ("sys.exit('fxmem: bye')", 1, "fxmem: bye"),
                                             ("None", 0, "")])
def test_the_console_script_ends_without_the_interpreter_s_teardown(tmp_path, ends, code, err):
    """``fxmem`` and ``python -m fxmem`` (fxmem.cli.entry.run) end with os._exit at the
    command's exit code once it returns: what it printed flushed, the exit handlers run,
    the objects it made not freed one by one (1.6 s of Llama-3.1-8B's command)."""
    handler = tmp_path / "atexit.txt"
    code_text = (
        "import atexit, sys\nimport fxmem.cli.entry as entry\n"
        f"atexit.register(lambda: open({str(handler)!r}, 'w').write('ran'))\n"
        "class Made:\n    def __del__(self):\n        print('torn down', file=sys.stderr)\n"
        "made = Made()\n"
        f"def main():\n    print('report', end='')\n    {ends}\n"
        "entry.main = main\nentry.run()\nprint('after run', file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code_text], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert (r.returncode, r.stdout, r.stderr.strip()) == (code, "report", err)
    assert handler.read_text() == "ran"
    with open(os.path.join(ROOT, "fxmem", "__main__.py")) as f:
        assert "from .cli.entry import run" in f.read()
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert 'fxmem = "fxmem.cli.entry:run"' in f.read()


def test_the_setup_rows_the_ways_out_do_not_need_are_made_with_the_summary(monkeypatch,
                                                                          capsys):
    """The setup's "peak in B, L" and longest-length rows are made when the summary is,
    after the budget's check has begun (its ways out, searched by children, need neither:
    on Llama-3.1-8B they had delayed what the one-GPU command's child waits for)."""
    from fxmem.cli import command, targets
    from fxmem.report import fit as fit_module

    order, real_fit, real_rows = [], fit_module.fit, targets.longest_rows

    def fit(*args, **kwargs):
        order.append("fit")
        return real_fit(*args, **kwargs)

    def rows(*args, **kwargs):
        order.append("rows")
        return real_rows(*args, **kwargs)
    monkeypatch.setattr(fit_module, "fit", fit)
    monkeypatch.setattr(targets, "longest_rows", rows)
    with pytest.raises(SystemExit) as done:
        command.main(["analyze", "hf:gpt2", "--config", "n_layer=1", "--config", "n_embd=64",
                      "--config", "n_head=2", "--seq", "32", "--optimizer", "adamw",
                      "--batch", "4", "--budget", "10GiB", "--format", "json"])
    out = capsys.readouterr()
    assert done.value.code in (0, None), out.err
    setup = json.loads(out.out)["setup"]
    assert order == ["fit", "rows"]
    assert "B*L" in setup["peak in B, L"] and "largest L within the budget at B=4" in setup
    assert list(setup)[-3:] == ["peak in B, L", "largest L within the budget at B=4",
                                "L limit (the model's positions)"]
