"""Every torch.optim optimizer fxmem traces, foreach on and off, parameter groups, and
zero_grad(set_to_none=False), against a real eager CPU step with the same implementation."""

import pytest
import torch

import fxmem
from zoo import ZOO

O = torch.optim
OPTIMIZERS = {
    "sgd": lambda p, **k: O.SGD(p, lr=0.1, **k),
    "sgd_momentum": lambda p, **k: O.SGD(p, lr=0.1, momentum=0.9, **k),
    "sgd_nesterov": lambda p, **k: O.SGD(p, lr=0.1, momentum=0.9, nesterov=True, **k),
    "adam": lambda p, **k: O.Adam(p, **k),
    "adam_amsgrad": lambda p, **k: O.Adam(p, amsgrad=True, **k),
    "adamw": lambda p, **k: O.AdamW(p, **k),
    "adamw_amsgrad": lambda p, **k: O.AdamW(p, amsgrad=True, **k),
    "adagrad": lambda p, **k: O.Adagrad(p, **k),
    "rmsprop": lambda p, **k: O.RMSprop(p, **k),
    "rmsprop_centered_momentum": lambda p, **k: O.RMSprop(p, centered=True, momentum=0.9, **k),
    "adamax": lambda p, **k: O.Adamax(p, **k),
    "nadam": lambda p, **k: O.NAdam(p, **k),
    "radam": lambda p, **k: O.RAdam(p, **k),
    "adadelta": lambda p, **k: O.Adadelta(p, **k),
    "rprop": lambda p, **k: O.Rprop(p, **k),
    # reads eta and mu in step(): fxmem answers mu = 1 (before averaging starts, t0 steps)
    "asgd": lambda p, **k: O.ASGD(p, **k),
    # reads its step count and norms in step(), only to scale updates: fxmem answers 1
    "adafactor": lambda p, **k: O.Adafactor(p, **k),
}


def _check(name, opt, batches=(2, 13), **kw):
    model, x, y, loss = ZOO[name]()
    r = fxmem.analyze(model, x, y, loss=loss, optimizer=opt, device="cpu", **kw)
    for b in batches:
        m = fxmem.measure(model, x, y, loss=loss, optimizer=opt, B=b, **kw)
        assert r.peak_bytes(b) == m.peak_bytes, (name, b)
    return r


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_every_optimizer_mlp(opt, foreach):
    _check("mlp", lambda p: OPTIMIZERS[opt](p, foreach=foreach))


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_every_optimizer_resnet(opt, foreach):
    # foreach steps add torch.tensor(1.0) to their CPU step counters: a lifted constant,
    # counted from its lift as eager counts it (fxmem.trace.kernels.rules.CONSTANT_LIFT_OPS)
    _check("resnet", lambda p: OPTIMIZERS[opt](p, foreach=foreach))


def test_parameter_groups_with_different_options():
    def groups(params):
        params = list(params)
        return O.AdamW([{"params": params[:2], "lr": 1e-2, "amsgrad": True},
                        {"params": params[2:], "weight_decay": 0.1}], foreach=False)
    r = _check("mlp", groups)
    state = sum(1 for s in r.trace.storages if s.category == "optimizer_state")
    assert state == 2 * 4 + 4 * 3  # 6 params; amsgrad keeps max_exp_avg_sq too: step, m, v (, vmax)


@pytest.mark.parametrize("name", ["mlp", "resnet", "transformer_train_mode", "seed_cnn"])
@pytest.mark.parametrize("opt", ["adam", "sgd_momentum", None])
def test_zero_grad_without_set_to_none_keeps_gradients(name, opt):
    optim = (lambda p: OPTIMIZERS[opt](p, foreach=False)) if opt else None
    r = _check(name, optim, set_to_none=False)
    assert all(s.created_by < 0 for s in r.trace.storages if s.category == "grad")
    base = fxmem.analyze(*ZOO[name]()[:2], ZOO[name]()[2], loss=ZOO[name]()[3],
                         optimizer=optim, device="cpu")
    assert r.parts["grads"] == base.parts["grads"]
    assert r.peak_bytes(13) >= base.peak_bytes(13)  # gradients live from the start


@pytest.mark.parametrize("name,history,max_iter", [("mlp", 7, 4), ("seed_cnn", 10, 5),
                                                  ("keeps_locals", 6, 4)])
def test_lbfgs_with_its_history(name, history, max_iter):
    # the steady state: a full history, every iteration run (the real step takes this path
    # on these models; see docs/training-setups.md for when it does not)
    opt = lambda p: O.LBFGS(p, lr=0.01, history_size=history, max_iter=max_iter)  # noqa: E731
    r = _check(name, opt)
    pairs = [s for s in r.trace.storages if s.category == "optimizer_state"
             and s.name.startswith(("old_dirs", "old_stps"))]
    assert len(pairs) == 2 * history
    n = sum(p.numel() for p in ZOO[name]()[0].parameters())
    assert all(int(s.size.expr) == 4 * n for s in pairs)  # one flat copy of the parameters


def test_lbfgs_combinations_that_do_not_apply_are_refused():
    model, x, y, loss = ZOO["mlp"]()
    kw = dict(loss=loss, device="cpu")
    with pytest.raises(fxmem.InputError, match="grad_accum does not apply"):
        fxmem.analyze(model, x, y, **kw, optimizer=O.LBFGS, grad_accum=2)
    with pytest.raises(fxmem.InputError, match="line search"):
        fxmem.analyze(model, x, y, **kw,
                      optimizer=lambda p: O.LBFGS(p, line_search_fn="strong_wolfe"))
    with pytest.raises(fxmem.InputError, match="GradScaler.step does not support closures"):
        fxmem.analyze(model, x, y, **kw, optimizer=O.LBFGS, amp=torch.float16)


def test_sparse_gradients_are_refused():
    class Bag(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(100, 16, sparse=True)

        def forward(self, ids):
            return self.emb(ids).sum(1)

    x, y = torch.randint(0, 100, (4, 5)), torch.randn(4, 16)
    for run in (fxmem.analyze, lambda *a, **k: fxmem.measure(*a, **k, B=2)):
        with pytest.raises(fxmem.InputError, match="emb makes sparse gradients"):
            run(Bag(), x, y, loss=torch.nn.functional.mse_loss, optimizer=O.SparseAdam)
    assert fxmem.analyze(Bag(), x, train=False).peak_bytes(4) > 0  # inference is fine


@pytest.mark.parametrize("name", ["mlp", "resnet", "transformer_train_mode", "seed_cnn"])
@pytest.mark.parametrize("opt", ["adam", "sgd_momentum", None])
def test_zero_grad_before_backward_keeps_last_gradients_through_the_forward(name, opt):
    # Lightning's closure order: training_step, zero_grad, backward
    optim = (lambda p: OPTIMIZERS[opt](p, foreach=False)) if opt else None
    r = _check(name, optim, zero_grad_at="backward")
    old = [s for s in r.trace.storages if s.category == "grad" and s.created_by < 0]
    assert old and all(s.freed_after is not None for s in old)  # freed at zero_grad
    base = fxmem.analyze(*ZOO[name]()[:2], ZOO[name]()[2], loss=ZOO[name]()[3],
                         optimizer=optim, device="cpu")
    assert r.parts["grads"] == base.parts["grads"]
    assert r.peak_bytes(13) >= base.peak_bytes(13)


@pytest.mark.parametrize("k", [1, 2])
def test_zero_grad_before_backward_through_the_cuda_allocator(k, monkeypatch):
    # each replayed step finds the previous step's gradients live at its start: the peak
    # the allocator reaches is the same at every step after the first (cuBLAS's workspaces
    # left out: 2.15 takes them per call, so they add to the peak only where it is a matmul)
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "0")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:1")
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 256))
    x, y, loss = torch.randn(4, 256), (), lambda o: o.sum()
    kw = dict(loss=loss, optimizer=lambda p: O.SGD(p, lr=0.1, foreach=True), grad_accum=k)
    late = fxmem.analyze(model, x, y, zero_grad_at="backward", **kw)
    early = fxmem.analyze(model, x, y, **kw)
    for b in (2, 64, 4096):
        run = late.runs_on_device(b, 2**30)
        assert run.fits and run.steps >= 2
        assert run.max_allocated - late.peak_bytes(b) == \
            early.runs_on_device(b, 2**30).max_allocated - early.peak_bytes(b)
    if k == 1:  # the forward with all of them (with k = 2, the second forward has them anyway)
        assert late.peak_bytes(64) > early.peak_bytes(64)


@pytest.mark.parametrize("name", ["mlp", "transformer_train_mode"])
@pytest.mark.parametrize("k", [1, 2])
def test_backward_on_a_copy_of_the_loss(name, k):
    # accelerate's Accelerator.backward: loss / gradient_accumulation_steps, held through
    # backward beside the loss
    r = _check(name, lambda p: O.AdamW(p, foreach=False), backward_copy=True, grad_accum=k)
    base = fxmem.analyze(*ZOO[name]()[:2], ZOO[name]()[2], loss=ZOO[name]()[3],
                         optimizer=lambda p: O.AdamW(p, foreach=False), device="cpu",
                         grad_accum=k)
    copies = [op for op in r.trace.ops if op.phase == "backward" and op.op == "aten.div.Tensor"]
    assert len(copies) >= k and r.peak_bytes(13) >= base.peak_bytes(13)


def test_set_to_none_is_checked():
    model, x, y, loss = ZOO["mlp"]()
    with pytest.raises(fxmem.InputError, match="set_to_none"):
        fxmem.analyze(model, x, y, loss=loss, device="cpu", set_to_none="no")
    with pytest.raises(fxmem.InputError, match="zero_grad_at must be 'start' or 'backward'"):
        fxmem.analyze(model, x, y, loss=loss, device="cpu", zero_grad_at="end")


@pytest.mark.parametrize("name", ["mlp", "resnet", "transformer_train_mode", "seed_cnn",
                                  "keeps_locals"])
@pytest.mark.parametrize("k", [2, 3])
def test_gradient_accumulation(name, k):
    # the trace runs 2 micro-steps (the first without gradients, one with them); the real
    # step runs all k
    model, x, y, loss = ZOO[name]()
    opt = OPTIMIZERS["adam"]
    r = _check(name, lambda p: opt(p, foreach=False), grad_accum=k)
    assert r.grad_accum == k and r.effective_batch_size(5) == 5 * k
    assert f"gradient accumulation: {k} micro-batches" in str(r)


def test_gradient_accumulation_is_checked():
    model, x, y, loss = ZOO["mlp"]()
    for bad in (0, 1.5, True):
        with pytest.raises(fxmem.InputError, match="grad_accum"):
            fxmem.analyze(model, x, y, loss=loss, device="cpu", grad_accum=bad)
    with pytest.raises(fxmem.InputError, match="nothing to accumulate"):
        fxmem.analyze(model, x, train=False, device="cpu", grad_accum=2)


def test_gradient_accumulation_with_a_checkpoint_plan():
    import copy

    model, x, y, loss = ZOO["resnet"]()
    kw = dict(loss=loss, optimizer=lambda p: OPTIMIZERS["adam"](p, foreach=False))
    plan = ["layer1.0", "layer1.1"]
    r = fxmem.analyze(model, x, y, **kw, device="cpu", checkpoint=plan, grad_accum=2)
    wrapped = fxmem.apply_checkpoints(copy.deepcopy(model), plan)
    for b in (2, 13):
        assert r.peak_bytes(b) == fxmem.measure(wrapped, x, y, **kw, B=b, grad_accum=2).peak_bytes


FUSED = {
    "adam": lambda p: O.Adam(p, fused=True),
    "adam_amsgrad": lambda p: O.Adam(p, fused=True, amsgrad=True),
    "adamw": lambda p: O.AdamW(p, fused=True),
    "sgd_momentum": lambda p: O.SGD(p, lr=0.1, momentum=0.9, fused=True),
    "adagrad": lambda p: O.Adagrad(p, fused=True),
}


@pytest.mark.parametrize("name", ["mlp", "resnet"])
@pytest.mark.parametrize("opt", sorted(FUSED))
def test_fused_optimizers_on_cpu(opt, name):
    _check(name, FUSED[opt])


def _trace_records(t) -> list:
    """Every op and storage record of trace ``t``, sizes as text."""
    ops = [(o.op, o.phase, o.module, o.out_sids, o.new_sids, o.in_sids, o.written_sids)
           for o in t.ops]
    return ops + [(s.sid, str(s.size.expr), s.category, s.name, s.created_by, s.freed_after,
                   s.saved, s.stream) for s in t.storages]


@pytest.mark.parametrize("parallel", [None, 2])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("opt", ["adamw", "adam_amsgrad", "sgd_momentum", "radam", "asgd",
                                 "rmsprop_centered_momentum", "adadelta"])
def test_the_optimizer_runs_no_update_in_place(opt, device, parallel, monkeypatch):
    """The optimizer's steps, the unrecorded one that makes its state and the recorded one,
    skip the kernels of updates in place (``fxmem.trace.engine.eager_ops.writes_only``):
    the trace is the one the steps run whole give, record for record, one rank of FSDP2
    too, and no such kernel ran on more than a step count."""
    import importlib

    from torch.utils._pytree import tree_leaves

    from fxmem.trace.engine import eager_ops

    analysis = importlib.import_module("fxmem.analyze")  # the module, not the function
    model, x, y, loss = ZOO["mlp"]()
    ran = []
    fake_kernel = eager_ops.EagerOps.fake_kernel

    def counting(self, func, args, kwargs):
        if self.phase == "optimizer" and eager_ops.writes_only(func) \
                and any(isinstance(t, torch.Tensor) and t.numel() > 1
                        for t in tree_leaves(args[0])):
            ran.append(func)  # (a step count's update runs: its value is read later)
        return fake_kernel(self, func, args, kwargs)

    def traced():
        t = []
        real = analysis.trace
        with monkeypatch.context() as m:
            m.setattr(analysis, "trace", lambda *a, **k: t.append(real(*a, **k)) or t[-1])
            m.setattr(eager_ops.EagerOps, "fake_kernel", counting)
            r = fxmem.analyze(model, x, y, loss=loss, optimizer=OPTIMIZERS[opt], device=device,
                              parallel=fxmem.FSDP(parallel) if parallel else None)
        for g in getattr(r, "groups", ()):
            g.report
        return [_trace_records(u) for u in t]

    skipped = traced()
    assert not ran
    with monkeypatch.context() as m:
        m.setattr(eager_ops, "writes_only", lambda func: False)
        whole = traced()
    assert skipped == whole
