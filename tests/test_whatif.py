"""fxmem.whatif: each row against a real eager step of the setup it describes."""

import copy

import torch

import fxmem
from fxmem.report.whatif import render_markdown
from zoo import SeedCNN, ZOO


def test_every_row_matches_a_real_step():
    model, x, y, loss = ZOO["seed_cnn"]()
    opt = lambda p: torch.optim.Adam(p, foreach=False)  # noqa: E731
    smaller = SeedCNN(c1=4, c2=8)
    rows = {r.method: r for r in fxmem.whatif(
        model, x, y, loss=loss, optimizer=opt, B=8, budget_bytes=2**22, device="cpu",
        smaller_model=smaller, amp=torch.bfloat16, grad_accum=4, checkpoint=["conv1"])}
    assert list(rows) == ["baseline", "smaller batch", "smaller model", "mixed precision",
                          "gradient accumulation", "no_grad evaluation", "checkpointing"]

    def real(m=model, b=8, **kw):
        return fxmem.measure(m, x, y if kw.get("train", True) else (),
                             loss=loss if kw.get("train", True) else None,
                             optimizer=opt if kw.get("train", True) else None, B=b,
                             **kw).peak_bytes

    assert rows["baseline"].peak_bytes == real()
    assert rows["smaller batch"].peak_bytes == real(b=4)
    assert rows["smaller model"].peak_bytes == real(m=smaller)
    assert rows["mixed precision"].peak_bytes == real(amp=torch.bfloat16)
    assert rows["gradient accumulation"].peak_bytes == real(b=2, grad_accum=4)
    assert rows["no_grad evaluation"].peak_bytes == real(train=False)
    wrapped = fxmem.apply_checkpoints(copy.deepcopy(model), ["conv1"])
    assert rows["checkpointing"].peak_bytes == real(m=wrapped)
    base = rows["baseline"]
    for r in rows.values():
        assert r.change_bytes == r.peak_bytes - base.peak_bytes
        if r.max_batch_size is not None and r.method != "gradient accumulation":
            assert r.max_batch_size >= 1
    assert rows["gradient accumulation"].max_batch_size % 4 == 0
    text = render_markdown(rows.values())
    assert text.count("\n") == len(rows) + 1 and "| mixed precision |" in text


def test_cuda_mixed_precision_row_follows_cuda_rules():
    model, x, y, loss = ZOO["mlp"]()
    rows = {r.method: r for r in fxmem.whatif(
        model, x, y, loss=loss, optimizer=torch.optim.SGD, B=8, budget_bytes=2**24,
        device="cuda", amp=torch.float16)}
    amp = rows["mixed precision"]
    assert amp.note == "forward and loss under torch.autocast('cuda', torch.float16) with a GradScaler"
    cuda = fxmem.analyze(model, x, y, loss=loss, optimizer=torch.optim.SGD, device="cuda",
                         amp=torch.float16)
    assert amp.peak_bytes == cuda.peak_bytes(8) and amp.peak == cuda.peak
