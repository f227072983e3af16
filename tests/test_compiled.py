"""A compiled model (``torch.compile``) where it cannot be traced: one line saying what it
needs (issue 39). Its prediction is checked on the fake GPU (tests/test_fake_gpu_compile.py)."""

import pytest
import torch
from torch.distributed.tensor.parallel import ColwiseParallel

import fxmem


def _compiled():
    return torch.compile(torch.nn.Linear(8, 2))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a device is there")
def test_a_compiled_model_needs_a_cuda_build_with_a_device():
    with pytest.raises(fxmem.InputError, match="needs a CUDA build of PyTorch with a device"):
        fxmem.analyze(_compiled(), torch.zeros(4, 8), loss=lambda o: o.sum(), device="cuda")


def test_a_compiled_model_is_traced_for_cuda_only():
    with pytest.raises(fxmem.InputError, match="device='cuda' only"):
        fxmem.analyze(_compiled(), torch.zeros(4, 8), loss=lambda o: o.sum(), device="cpu")


def _stack():
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _parts():
    """Blocks compiled one by one: ``torch.compile(block)`` put in the model (as torchtitan
    did) and ``block.compile()`` (as it does now)."""
    m = _stack()
    m[0] = torch.compile(m[0])
    m[2].compile()
    return m


def test_parts_compiled_on_their_own_say_what_they_need():
    """Parts compiled on their own are lowered one by one on CUDA (the fake GPU's tests:
    tests/test_fake_gpu_compile.py); on the CPU, or in a model compiled whole (where they
    would run eagerly under its fake tensors), one line says why not."""
    def analyze(model, **kw):
        fxmem.analyze(model, torch.zeros(4, 8), loss=lambda o: o.sum(), **kw)

    with pytest.raises(fxmem.InputError, match=r"^module 0 \(and 1 more\) is compiled on its "
                                               r"own: a compiled model .* device='cuda' only"):
        analyze(_parts(), device="cpu")
    whole = _stack()
    whole.compile()
    with pytest.raises(fxmem.InputError, match=r"^the model is compiled in place .* "
                                               r"device='cuda' only"):
        analyze(whole, device="cpu")
    inner = _stack()
    inner[2] = torch.compile(inner[2])
    for device in ("cpu", "cuda"):
        with pytest.raises(fxmem.InputError, match=r"^module 2 is compiled on its own inside "
                                                   r"a model compiled whole"):
            analyze(torch.compile(inner), device=device)
    if not torch.cuda.is_available():
        with pytest.raises(fxmem.InputError, match="needs a CUDA build of PyTorch"):
            analyze(_parts(), device="cuda")


@pytest.mark.parametrize("plan", [["layers.0"], ["_orig_mod.0"]])
def test_a_model_compiled_whole_refuses_an_eager_plan_as_such(plan):
    """A model compiled whole is planned by torch.compile's budgets; an eager plan over it
    was refused by what it said of the module ("no submodule", "runs 0 times in one
    step"), not that the step is compiled."""
    with pytest.raises(fxmem.InputError, match=r"^the model is compiled whole "
                                               r"\(torch.compile\(model\)\): eager checkpoint"):
        fxmem.analyze(torch.compile(_stack()), torch.zeros(4, 8), loss=lambda o: o.sum(),
                      device="cuda", checkpoint=plan)


_TP = fxmem.TP(2, {"2": ColwiseParallel()})
_PLANS_ARE = (r"are not modelled yet \(on one GPU, under FSDP2 and HSDP, CPU offload "
              r"included, TP, FSDP2 x TP and DDP without static_graph, they are\)")


@pytest.mark.parametrize("option, message", [
    ({"parallel": fxmem.DDP(2, static_graph=True), "checkpoint": ["0"]},
     r"checkpoint plans over parts compiled on their own under DDP over 2 ranks "
     r"\(static_graph=True\) " + _PLANS_ARE),
    ({"parallel": fxmem.DDP(2, static_graph=True)},
     r"parts compiled on their own under DDP over 2 ranks \(static_graph=True\) are not "
     r"modelled yet \(under FSDP2 and HSDP, CPU offload included; TP; FSDP2 x TP; DDP "
     r"without static_graph, ZeRO-1 included, they are\)"),
    ({"compile": True}, "compile= compiles the model whole"),
])
def test_parts_compiled_on_their_own_refuse_what_is_not_modelled(option, message):
    """Under a checkpoint plan, data or tensor parallelism, or ``compile=``: one line, before
    anything is traced."""
    with pytest.raises(fxmem.InputError, match=r"^module 0 \(and 1 more\) is compiled on its "
                                               r"own: " + message):
        fxmem.analyze(_parts(), torch.zeros(4, 8), loss=lambda o: o.sum(), device="cuda",
                      **option)


@pytest.mark.parametrize("parallel", [fxmem.DDP(2), fxmem.DDP(2, zero1=True),
                                      fxmem.DDP(2, gradient_as_bucket_view=True)],
                         ids=lambda p: p.name)
def test_parts_compiled_on_their_own_are_modelled_under_ddp(parallel):
    """Under DDP (ZeRO-1 and the gradients views of the buckets too) the parts are traced
    on each rank (checked on the fake GPU's ranks: tests/test_fake_gpu_parallel.py); they
    had been refused in one line."""
    from fxmem.trace.compiled.parts import check_parts

    assert parallel.runs_compiled_parts()
    check_parts(_parts(), None, parallel, None)


@pytest.mark.parametrize("fsdp", [fxmem.FSDP(2), fxmem.FSDP(4, replicate=2),
                                  fxmem.FSDP(2, offload=True)], ids=lambda f: f.name)
def test_parts_compiled_on_their_own_are_modelled_under_fsdp2_x_tp(fsdp):
    """Under FSDP2 x TP (a 2-D mesh; HSDP x TP, CPU offload over TP) the parts are traced on
    each rank (checked on the fake GPU's 4 ranks: tests/test_fake_gpu_parallel.py); they had
    been refused in one line."""
    from fxmem.trace.compiled.parts import check_parts

    parallel = fxmem.Parallel(fsdp=fsdp, tp=fxmem.TP(2, {"2": ColwiseParallel()}))
    assert parallel.runs_compiled_parts()
    check_parts(_parts(), None, parallel, None)


@pytest.mark.parametrize("parallel", [fxmem.FSDP(2), fxmem.FSDP(4, replicate=2),
                                      fxmem.FSDP(2, offload=True), fxmem.DDP(2),
                                      fxmem.DDP(2, zero1=True),
                                      fxmem.DDP(2, gradient_as_bucket_view=True),
                                      _TP, *(fxmem.Parallel(fsdp=f, tp=_TP)
                                             for f in (fxmem.FSDP(2), fxmem.FSDP(4, replicate=2),
                                                       fxmem.FSDP(2, offload=True)))],
                         ids=lambda p: p.name)
def test_a_plan_over_parts_compiled_on_their_own_is_modelled_under_a_strategy(parallel):
    """Under FSDP2, HSDP (CPU offload too), DDP (ZeRO-1, the buckets' views), TP and FSDP2 x
    TP (HSDP x TP, CPU offload over TP) a plan over whole parts ``torch.compile(block)`` is
    traced on each rank, each part lowered as ``torch.compile(checkpoint_wrapper(block))``
    (checked on the fake GPU's ranks against torchtitan's recipe:
    tests/test_fake_gpu_parallel.py); it had been refused in one line ("not modelled yet (on
    one GPU they are)"; under TP and FSDP2 x TP, "(on one GPU, under FSDP2 and HSDP, ... they
    are)")."""
    from fxmem.trace.compiled.parts import check_parts

    assert parallel.runs_planned_parts()
    check_parts(_parts(), ["0"], parallel, None)


def _nested():
    """A block of a linear compiled on its own and a ReLU, then a linear compiled on its own
    in a block of its own, then a linear compiled in place."""
    m = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()),
                            torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    m[0][0] = torch.compile(m[0][0])
    m[1] = torch.compile(torch.nn.Sequential(m[1]))
    m[2].compile()
    return m


@pytest.mark.parametrize("plan, message", [
    (["1._orig_mod.0"], r"module 1._orig_mod.0 is inside module 1, compiled on its own: a plan "
                        r"checkpoints such a part whole, not modules inside it"),
    (["0"], r"module 0 holds module 0.0, compiled on its own: an eager checkpoint around "
            r"compiled code is not modelled; checkpoint the parts themselves"),
    ([fxmem.Region(("1",), (("aten.mm.default", 1),))], r"1 \(saving 1 op output\) is "
                                                       r"selective or a group over module 1, "
                                                       r"compiled on its own: a plan "
                                                       r"checkpoints such a part whole"),
])
@pytest.mark.parametrize("parallel", [None, fxmem.FSDP(2), fxmem.DDP(2), _TP,
                                      fxmem.Parallel(fsdp=fxmem.FSDP(2), tp=_TP)],
                         ids=lambda p: "one GPU" if p is None else p.name)
def test_a_plan_over_parts_compiled_on_their_own_checkpoints_them_whole(plan, message,
                                                                         parallel):
    """On one GPU, and under FSDP2, DDP, TP or FSDP2 x TP, a plan may checkpoint a part
    ``torch.compile(block)`` whole (lowered as ``torch.compile(checkpoint_wrapper(block))``:
    the fake GPU's tests), or modules outside every part; else one line, before anything is
    traced."""
    with pytest.raises(fxmem.InputError, match=r"^checkpoint plan: " + message) as e:
        fxmem.analyze(_nested(), torch.zeros(4, 8), loss=lambda o: o.sum(), device="cuda",
                      checkpoint=plan, parallel=parallel)
    assert "\n" not in str(e.value)


def test_a_plan_applied_to_a_part_compiled_on_its_own_wraps_it_inside_the_compile():
    """``fxmem.apply_checkpoints`` over a part ``torch.compile(block)`` makes it
    ``torch.compile(checkpoint_wrapper(block))`` with the part's own options: the step
    ``fxmem.analyze`` traces for the plan (tests/test_fake_gpu_compile.py)."""
    from torch._dynamo.eval_frame import OptimizedModule
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    m = _nested()
    part, ctx = m[1]._orig_mod, m[1].dynamo_ctx
    fxmem.apply_checkpoints(m, ["1"])
    assert isinstance(m[1], OptimizedModule) and m[1].dynamo_ctx is ctx
    assert isinstance(m[1]._orig_mod, CheckpointWrapper)
    assert m[1]._orig_mod._checkpoint_wrapped_module is part


def test_a_plan_applied_to_a_block_compiled_in_place_wraps_it_then_compiles_in_place():
    """``fxmem.apply_checkpoints`` over a block compiled in place (``block.compile()``) puts
    ``checkpoint_wrapper(block)`` in the model compiled in place by the block's own dynamo
    context, the block's compile moved to it: torchtitan's recipe, the step
    ``fxmem.analyze`` traces for the plan (tests/test_fake_gpu_compile.py). It had been
    refused ("module 2 is compiled in place (block.compile()): plans over it are not
    modelled yet")."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from fxmem.trace.compiled import in_place_context

    m = _nested()
    block, ctx = m[2], in_place_context(m[2])
    fxmem.apply_checkpoints(m, ["2"])
    assert isinstance(m[2], CheckpointWrapper) and m[2]._checkpoint_wrapped_module is block
    assert in_place_context(m[2]) is ctx and block._compiled_call_impl is None


def test_a_plan_over_a_block_compiled_in_place_is_modelled_under_a_strategy():
    """On one GPU and under FSDP2, HSDP (CPU offload too), DDP (ZeRO-1, the buckets' views),
    TP and FSDP2 x TP (HSDP x TP, CPU offload over TP) a plan over a block compiled in place
    is traced as torchtitan's recipe runs it (``checkpoint_wrapper(block)``, then
    ``.compile()`` on the wrapper, then the strategy: the fake GPU's tests). It had been
    refused everywhere ("plans over it are not modelled yet; over torch.compile(block) put
    in the model they are"); a strategy that does not say it runs such plans
    (``runs_planned_parts``) still refuses them in one line."""
    from fxmem.trace.plans.checkpointing import normalize_plan

    normalize_plan(_nested(), ["2"])
    for ok in (fxmem.FSDP(2), fxmem.FSDP(4, replicate=2), fxmem.FSDP(2, offload=True),
               fxmem.DDP(2), fxmem.DDP(2, zero1=True),
               fxmem.DDP(2, gradient_as_bucket_view=True), _TP,
               *(fxmem.Parallel(fsdp=f, tp=_TP) for f in (
                   fxmem.FSDP(2), fxmem.FSDP(2, replicate=2), fxmem.FSDP(2, offload=True)))):
        assert ok.runs_planned_parts(), ok.name
        normalize_plan(_nested(), ["2"], ok)
    with pytest.raises(fxmem.InputError, match=r"^checkpoint plan: module 2 is compiled in "
                                               r"place \(block.compile\(\)\) under DDP .*: "
                                               r"plans over it are not modelled yet \(on one "
                                               r"GPU, under FSDP2, HSDP, DDP, TP and FSDP2 x "
                                               r"TP they are\)$") as e:
        normalize_plan(_nested(), ["2"], fxmem.DDP(2, static_graph=True))
    assert "\n" not in str(e.value)


def test_a_compiled_step_s_plan_is_traced_not_derived():
    """``with_plan`` derives a plan from an eager step's ops; a compiled step's ops are its
    graphs' buffers (what re-runs is the partitioner's): one line naming the traced way."""
    from types import SimpleNamespace

    from fxmem.report.result import Report

    trace = SimpleNamespace(compiled=True, plan=(), calls=(SimpleNamespace(path="0"),))
    compiled = SimpleNamespace(trace=trace, _b_only=lambda what: None)
    with pytest.raises(fxmem.InputError, match=r"^a checkpoint plan is derived from an eager "
                                               r"step's trace; this step ran compiled "
                                               r"\(torch.compile\): trace the plan, "
                                               r"fxmem.analyze\(..., checkpoint=plan\)$"):
        Report.with_plan(compiled, ["0"])


@pytest.mark.parametrize("parallel", [fxmem.FSDP(2), fxmem.DDP(2)])
def test_a_model_compiled_whole_under_a_strategy_is_one_line(parallel):
    """It had ended in the trace, on the fake GPU, as "the compiled model does not run on
    the trace's fake tensors: ... Tensor device mismatch" (the rank's shards on the CPU).
    (``compile=`` under a strategy compiles each block instead: the fake GPU's tests.)"""
    with pytest.raises(fxmem.InputError, match=r"^the model is compiled whole under "
                                               + parallel.name.split(" ")[0] + " over 2 "
                                               r"ranks: not modelled yet") as e:
        fxmem.analyze(torch.compile(_stack()), torch.zeros(4, 8), loss=lambda o: o.sum(),
                      device="cuda", parallel=parallel)
    assert "\n" not in str(e.value)


def _repeated():
    """Two blocks of one class in a ``ModuleList`` and a head: what ``compile=`` compiles
    block by block under a strategy."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])
            self.head = torch.nn.Linear(8, 2)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.head(x)
    return M()


def _compiled_layer():
    m = _repeated()
    m.layers[0].compile()
    return m


@pytest.mark.parametrize("model, kw, parallel, message", [
    (_stack, {}, fxmem.FSDP(2), r"^compile= under FSDP2 over 2 ranks compiles each of the "
                                r"model's repeated blocks .* and this model has none"),
    (_compiled_layer, {}, fxmem.FSDP(2), r"^module layers.0 is compiled on its own: compile= "
                                         r"under FSDP2 over 2 ranks compiles each of the "
                                         r"model's blocks itself"),
    (_repeated, {"device": "cpu"}, fxmem.FSDP(2), r"^compile= lowers the step with inductor "
                                                  r"for CUDA"),
    (_repeated, {}, fxmem.DDP(2, static_graph=True), r"^compile= under DDP .*: not modelled "
                                                     r"yet"),
    (_repeated, {"checkpoint": [fxmem.Region(("layers.0",), (("aten.mm.default", 1),))]},
     fxmem.FSDP(2), r"^checkpoint plan: layers.0 \(saving 1 op output\) is selective or a "
                    r"group over module layers.0, compiled on its own: a plan checkpoints "
                    r"such a part whole"),
])
def test_compile_option_under_a_strategy_refuses_in_one_line(model, kw, parallel, message):
    """``compile=`` under a strategy compiles each repeated block of a rank's copy in place;
    what it does not model is refused before anything is traced, in one line (a plan over
    those blocks checkpoints each whole, as over blocks the user compiled in place)."""
    options = {"device": "cuda", **kw}
    with pytest.raises(fxmem.InputError, match=message) as e:
        fxmem.analyze(model(), torch.zeros(4, 8), loss=lambda o: o.sum(), parallel=parallel,
                      compile=True, **options)
    assert "\n" not in str(e.value)


def test_a_wrapper_line_marked_twice_belongs_to_the_module_it_names():
    """Inductor can mark one line of its wrapper twice, once with a node of no module (the
    graph's glue), once with a module's (seen over a Llama 3.1 8B layer's backward under
    FSDP2): the line counts for the module. The marks had been sorted as pairs, and a
    module's path compared with None ended the trace in a TypeError."""
    from types import SimpleNamespace

    from fxmem.trace.compiled.inductor import Lines

    glue = SimpleNamespace(meta={})
    mlp = SimpleNamespace(meta={"nn_module_stack": {"a": ("L['self'].mlp", object)}})
    lines = Lines()
    lines.add(__file__, [(3, mlp), (3, glue), (9, glue)])
    assert lines.files[__file__] == ([3, 3, 9], [None, "mlp", None])


def test_a_model_compiled_in_place_under_fsdp2_is_one_line():
    """Blocks compiled in place (``block.compile()``, as torchtitan does) are lowered on each
    rank as ``torch.compile(block)`` put back is (the fake GPU's tests:
    tests/test_fake_gpu_parallel.py); the model compiled in place is one line."""
    whole = _stack()
    whole.compile()
    with pytest.raises(fxmem.InputError, match=r"^the model is compiled in place "
                                               r"\(model.compile\(\)\) under FSDP2 over 2 "
                                               r"ranks: not modelled yet; its blocks") as e:
        fxmem.analyze(whole, torch.zeros(4, 8), loss=lambda o: o.sum(), device="cuda",
                      parallel=fxmem.FSDP(2))
    assert "\n" not in str(e.value)


def test_a_rank_s_copy_keeps_the_blocks_compiled_in_place():
    """A deep copy drops ``block.compile()`` (``Module.__getstate__``): a rank's meta copy
    compiles its own block in place again, by the same dynamo context (backend, options),
    so that it runs the copy's parameters, not the model's."""
    from fxmem.trace.compiled import in_place_context
    from fxmem.trace.parallel.fsdp import meta_copy

    m = _stack()
    m[2].compile(backend="eager")  # dynamo runs it on any device
    copied = meta_copy(m)
    assert in_place_context(copied[2]) is in_place_context(m[2])
    assert copied[1]._compiled_call_impl is None
    assert copied(torch.zeros(4, 8, device="meta")).device.type == "meta"  # its own weights
    assert m(torch.zeros(4, 8)).device.type == "cpu"


# --- compile= (fxmem.trace.compiled.options) ---

def _linear():
    return torch.nn.Linear(8, 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a device is there")
@pytest.mark.parametrize("entry", ["analyze", "measure"])
def test_compile_option_needs_a_cuda_build_with_a_device(entry):
    fn = getattr(fxmem, entry)
    kw = {"B": 4} if entry == "measure" else {}
    with pytest.raises(fxmem.InputError, match="needs a CUDA build of PyTorch with a device") as e:
        fn(_linear(), torch.zeros(4, 8), loss=lambda o: o.sum(), device="cuda", compile=True,
           **kw)
    assert "\n" not in str(e.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a device is there")
def test_measuring_a_cuda_step_needs_a_device_or_the_fake_gpu():
    with pytest.raises(fxmem.InputError, match="fake GPU") as e:
        fxmem.measure(_linear(), torch.zeros(4, 8), loss=lambda o: o.sum(), device="cuda", B=4)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("value, message", [
    ({"budget": 0.5}, "compile= takes activation_memory_budget, mode, options; got budget"),
    ({"activation_memory_budget": 0}, r"activation_memory_budget is a fraction in \(0, 1\]"),
    ({"activation_memory_budget": 1.5}, r"a fraction in \(0, 1\], got 1.5"),
    ({"mode": "reduce-overhead"}, "runs the step as a CUDA graph"),
    ({"mode": "fast"}, "compile mode is one of"),
    ({"mode": "default", "options": {"max_autotune": True}}, "a mode or options, not both"),
    ("yes", "compile= is True, False or a dict"),
])
def test_a_bad_compile_option_is_one_line(value, message):
    with pytest.raises(fxmem.InputError, match=message) as e:
        fxmem.analyze(_linear(), torch.zeros(4, 8), loss=lambda o: o.sum(), compile=value)
    assert "\n" not in str(e.value)


def test_compile_option_is_for_cuda():
    with pytest.raises(fxmem.InputError, match="compile= lowers the step with inductor for "
                                               "CUDA: device='cuda'"):
        fxmem.analyze(_linear(), torch.zeros(4, 8), loss=lambda o: o.sum(), device="cpu",
                      compile=True)


def test_compile_option_takes_the_model_itself():
    with pytest.raises(fxmem.InputError, match="pass the model itself"):
        fxmem.analyze(_compiled(), torch.zeros(4, 8), loss=lambda o: o.sum(), compile=True)


def test_the_command_line_says_what_compile_needs():
    from click.testing import CliRunner

    from fxmem.cli import cli

    import os

    target = os.path.join(os.path.dirname(__file__), "fakegpu_compile_targets.py:Pointwise")
    base = ["analyze", target, "--input", "B,256",
            "--target", "B,256", "--loss", "mse"]
    r = CliRunner().invoke(cli, [*base, "--compile-budget", "0.5"])
    assert r.exit_code == 2 and "give --compile too" in r.output
    r = CliRunner().invoke(cli, [*base, "--compile", "--device", "cpu"])
    assert r.exit_code == 2 and "device='cuda'" in r.output
    if not torch.cuda.is_available():
        r = CliRunner().invoke(cli, [*base, "--compile"])
        assert r.exit_code == 2 and "needs a CUDA build of PyTorch with a device" in r.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA build with a device")
@pytest.mark.parametrize("how", ["compile=", "parts"])
def test_a_compiled_parallel_step_without_a_cuda_build_is_one_line(how):
    """Under FSDP2, blocks compiled by ``compile=`` or by the user (``torch.compile(block)``
    put back) need a CUDA build too, said before any rank is wrapped: it had been "cannot
    trace the step on fake tensors: AssertionError: Torch not compiled with CUDA enabled
    (module (root), during setup)"."""
    from fakegpu_compile_targets import blocks

    model = blocks("eager" if how == "compile=" else "each")
    options = {"compile": True} if how == "compile=" else {}
    with pytest.raises(fxmem.InputError, match="needs a CUDA build of PyTorch with a device"):
        fxmem.analyze(model, torch.zeros(4, 256), torch.zeros(4, 10),
                      loss=torch.nn.functional.mse_loss,
                      optimizer=torch.optim.Adam, device="cuda", parallel=fxmem.FSDP(2),
                      **options)


def test_checkpoint_auto_with_compile_refuses_what_it_cannot_choose():
    """``--checkpoint auto --compile`` chooses the compile budget itself (a given one is
    refused, in one line, before anything is traced); under FSDP2 it compares the budgets
    of each block compiled too: a model with no repeated blocks, and on a machine without
    a CUDA build any model, is told so in one line."""
    import os

    from click.testing import CliRunner

    from fxmem.cli import cli

    target = os.path.join(os.path.dirname(__file__), "fakegpu_compile_targets.py:Pointwise")
    base = ["analyze", target, "--input", "B,256", "--target", "B,256", "--loss", "mse",
            "--compile", "--checkpoint", "auto"]
    r = CliRunner().invoke(cli, [*base, "--compile-budget", "0.5"])
    assert r.exit_code == 2 and "chooses the torch.compile budget itself" in r.output
    r = CliRunner().invoke(cli, [*base, "--fsdp", "2", "--budget", "1MiB"])
    assert r.exit_code == 2 and "this model has none" in r.output  # no blocks to compile
    if not torch.cuda.is_available():
        blocks = target.replace(":Pointwise", ":Blocks")
        r = CliRunner().invoke(cli, ["analyze", blocks, "--input", "B,256", "--target",
                                     "B,10", *base[6:], "--fsdp", "2", "--budget", "1MiB"])
        assert r.exit_code == 2 and "needs a CUDA build of PyTorch with a device" in r.output


def test_a_graph_s_own_peak_counts_what_it_makes_and_frees():
    """fxmem's figure beside inductor's estimate (fxmem.report.inductor): over a graph's run
    (ops 2..4), the storages it makes and those made before that it frees, the most live at
    once; a storage made before and kept, or made after, does not count."""
    import types

    from fxmem.formula.symbols import Size
    from fxmem.report.inductor import _own_peak

    def st(made, gone, n):
        return types.SimpleNamespace(created_by=made, freed_after=gone, size=Size.of(n))

    storages = [st(0, 3, 100),     # an input the run frees after op 3: counts until then
                st(1, None, 1000),  # made before, kept: not the run's
                st(2, 2, 10),       # the run's, freed after op 2
                st(3, None, 50),    # the run's output
                st(4, 4, 7),        # the run's, at its last op
                st(5, 6, 999)]      # after the run
    # just before: 100; op 2: 110; op 3: 150; op 4: 57
    assert _own_peak(storages, 2, 4, 1) == 150
    assert _own_peak(storages[:1], 2, 4, 1) == 100
