"""Compiled steps on the fake GPU (issue 39; tests/test_fake_gpu_compile.py): the model, and
the measured step written with PyTorch alone, so that the measurement shares no code with
fxmem's trace.

A compiled model is compiled once, with B dynamic, at the batch size it first runs at
(``compiled_at``): inductor makes some choices by that size (how many pieces a reduction
over B is split into), and the code it writes then serves every B."""

import gc

import torch
import torch.nn as nn


class Pointwise(nn.Module):
    """Two linears around a chain of pointwise ops: eager holds each op's output for
    backward, inductor fuses the chain into one kernel and saves less."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(256, 1024)
        self.b = nn.Linear(1024, 256)

    def forward(self, x):
        h = self.a(x)
        h = (h * torch.sigmoid(h)).sin() * 2 + h.cos()
        return self.b(h.tanh())


def square_sum(out):
    return out.square().sum()


class Residual(nn.Module):
    """:class:`Pointwise` with a residual: a block of :class:`Blocks`."""

    def __init__(self):
        super().__init__()
        self.inner = Pointwise()

    def forward(self, x):
        return x + self.inner(x)


class Blocks(nn.Module):
    """``n`` :class:`Residual` blocks (two by default) and a head."""

    def __init__(self, n: int = 2):
        super().__init__()
        self.layers = nn.ModuleList([Residual() for _ in range(n)])
        self.head = nn.Linear(256, 10)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def blocks(how: str):
    """:class:`Blocks` compiled ``how``: ``"each"``, each block ``torch.compile(block)`` put
    back in its list (as torchtitan did); ``"checkpointed"``, each block
    ``torch.compile(checkpoint_wrapper(block))`` (torchtitan's activation checkpointing,
    then compile: the checkpoint inside the compiled graph); ``"wrapped"``, each block
    ``checkpoint_wrapper(block)``, none compiled (the case compiles the model whole);
    ``"in_place"``, ``block.compile()``; ``"checkpointed_in_place"``, each block
    ``checkpoint_wrapper(block)`` put back, then compiled in place (``.compile()`` on the
    wrapper: torchtitan's recipe now); ``"model"``, ``model.compile()``; ``"eager"``,
    none."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    m = Blocks()
    if how in ("each", "checkpointed", "wrapped"):
        for i, layer in enumerate(m.layers):
            if how != "each":
                layer = checkpoint_wrapper(layer)
            m.layers[i] = layer if how == "wrapped" else torch.compile(layer)
    elif how == "in_place":
        for layer in m.layers:
            layer.compile()
    elif how == "checkpointed_in_place":
        for i, layer in enumerate(m.layers):
            m.layers[i] = checkpoint_wrapper(layer)
            m.layers[i].compile()
    elif how == "model":
        m.compile()
    return m


def gpt2(n_layer=2, n_embd=64):
    """A small GPT-2 (transformers, random weights), SDPA attention, no dropout."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=4, vocab_size=1000,
                     n_positions=256, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     attn_implementation="sdpa")
    return GPT2LMHeadModel(cfg)


def llama(layers=2, hidden=64, use_cache=True):
    """A small Llama (transformers, random weights): RMSNorm, rotary, GQA, SiLU MLP, SDPA.
    ``use_cache=False``: no cache is made in the forward, so that transformers asks
    ``find_packed_sequence_indices`` whether the batch packs sequences (a value a kernel
    computes: see :func:`measure_step`)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=4 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      vocab_size=1000, max_position_embeddings=256,
                      attn_implementation="sdpa", use_cache=use_cache)
    return LlamaForCausalLM(cfg)


def lm_loss(out, ids):
    return torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), ids.flatten())


AMP = {"gpt2_bf16": torch.bfloat16}  # case -> the autocast dtype of its forward and loss


def _case(name: str):
    """(model, batch of size b -> (inputs, targets), loss, optimizer class); a case of
    :data:`AMP` is its model's, run under autocast."""
    name = name.removesuffix("_bf16")
    if name == "pointwise":
        return (Pointwise(), lambda b, dev: ((torch.zeros(b, 256, device=dev),), ()),
                lambda out: square_sum(out), torch.optim.SGD)
    if name.startswith("blocks_"):  # compiled parts: the model brings them (compile=False)
        return (blocks(name.removeprefix("blocks_")),
                lambda b, dev: ((torch.zeros(b, 256, device=dev),), ()),
                lambda out: square_sum(out), torch.optim.SGD)
    if name in ("gpt2", "llama", "llama_nocache"):
        def batch(b, dev):
            ids = torch.zeros(b, 128, dtype=torch.long, device=dev)
            return (ids,), (ids.clone(),)  # two tensors, as fxmem's inputs and targets are
        model = gpt2() if name == "gpt2" else llama(use_cache=name == "llama")
        return model, batch, lm_loss, torch.optim.AdamW
    raise ValueError(name)


def measure(name: str, B: int, compiled_at: int, compile: bool = True, steps: int = 2,
            history: bool = False, budget: float | None = None) -> dict:
    """One steady-state step at ``B`` of case ``name`` (compiled first at ``compiled_at``
    with dim 0 dynamic, when ``compile``, with AOTAutograd's ``activation_memory_budget``
    when ``budget`` is given): PyTorch's own peaks after ``empty_cache`` and a peak reset."""
    if budget is None:
        return _measure(name, B, compiled_at, compile, steps, history)
    from torch._functorch import config

    with config.patch(activation_memory_budget=budget):
        return _measure(name, B, compiled_at, compile, steps, history)


def measure_each(batches: list, **kw) -> dict:
    """:func:`measure` at each of ``batches`` in turn, in this process, set back between
    them as a fresh process starts (the step's tensors collected, the cuBLAS workspaces let
    go, every cached segment returned): {str(B): figures}. Its graphs load from the cache an
    earlier process filled (a process that compiles them cold ends with other figures)."""
    return _each(batches, lambda b: measure(B=b, **kw))


def _each(batches, fn) -> dict:
    from fakegpu_batch import set_back

    out = {}
    for b in batches:
        out[str(b)] = fn(b)
        set_back()
    return out


def _measure(name, B, compiled_at, compile, steps, history):  # noqa: N803
    torch.manual_seed(0)
    model, batch, loss, opt_class = _case(name)
    return measure_step(model, batch, loss, lambda p: opt_class(p, lr=0.1), B, compiled_at,
                        compile, steps, history, amp=AMP.get(name))


def measure_step(model, batch, loss, make_optimizer, B: int, compiled_at: int,  # noqa: N803
                 compile: bool = True, steps: int = 2, history: bool = False,
                 start_at_b: bool = False, amp=None, whole_run: bool = False) -> dict:
    """The measured step of :func:`measure` for any model: ``batch(b, device)`` gives
    ``(inputs, targets)``, ``loss(output, *targets)``, ``make_optimizer(params)``.
    ``whole_run``: the peaks of the whole run, its first steps too (what a card must hold
    for it), not of the last step after an emptied cache.
    ``start_at_b``: the run's first steps are at ``B``, not at ``compiled_at`` (its graphs
    come from the cache a run at ``compiled_at`` filled): the optimizer state is then made
    beside a step at ``B``, as fxmem's replay makes it. ``amp``: a dtype the forward and
    the loss run under ``torch.autocast`` in.

    An eager step (``compile`` False) runs within
    :func:`fxmem.validate.fakegpu.reads.gpu_answers`, as ``fxmem validate --fake-gpu``
    does: no kernel runs on the fake GPU, so transformers' packed-sequence check
    (``find_packed_sequence_indices``, asked by a causal LM called with no attention mask
    and no cache) would read 0 and build the 4-D mask a GPU does not, and SDPA would
    convert it to a float bias that each layer keeps for its backward. A compiled step
    needs no answer: under dynamo the check returns its mask without reading it
    (``is_tracing``), on a GPU too."""
    import contextlib

    from fxmem.validate.fakegpu.reads import gpu_answers

    with contextlib.nullcontext() if compile else gpu_answers():
        return _measure_step(model, batch, loss, make_optimizer, B, compiled_at, compile,
                             steps, history, start_at_b, amp, whole_run)


def _measure_step(model, batch, loss, make_optimizer, B, compiled_at,  # noqa: N803
                  compile, steps, history, start_at_b, amp, whole_run):
    import contextlib

    model = model.cuda()
    run = torch.compile(model) if compile else model
    opt = make_optimizer(model.parameters())

    def step(inputs, targets):
        with torch.autocast("cuda", dtype=amp) if amp else contextlib.nullcontext():
            value = loss(run(*inputs), *targets)
        value.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for b in (B,) if start_at_b else (compiled_at, B):
        inputs, targets = batch(b, "cuda")
        for t in inputs:
            torch._dynamo.mark_dynamic(t, 0)
        for _ in range(steps):
            step(inputs, targets)
    torch.cuda.synchronize()
    if not whole_run:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    if history:
        torch.cuda.memory._record_memory_history(max_entries=1000000)
    step(inputs, targets)
    out = {"max_allocated": torch.cuda.max_memory_allocated(),
           "max_reserved": torch.cuda.max_memory_reserved()}
    if history:
        out["history"] = _events(torch.cuda.memory._snapshot())
        torch.cuda.memory._record_memory_history(enabled=None)
    return out


def whole_run(name: str, B: int) -> dict:  # noqa: N803
    """The eager step of case ``name`` at ``B``, three steps from a fresh start, as
    ``benchmarks/compiled_peers.py`` runs one (``start_at_b``, ``whole_run``): PyTorch's
    peaks over the whole run, with the fake GPU's reads answered as a GPU's
    (``measured``) and not (``unanswered``, each in a fresh model and allocator), and
    fxmem's replay of the same run (``Report.runs_on_device`` with the whole card)."""
    import fxmem
    from fxmem.validate.fakegpu.run import TOTAL_BYTES

    from fakegpu_batch import set_back

    def run(fn):
        torch.manual_seed(0)
        model, batch, loss, opt_class = _case(name)
        got = fn(model, batch, loss, lambda p: opt_class(p, lr=0.1), B, B, False, 3, False,
                 True, None, True)
        set_back()
        return got

    measured = run(measure_step)
    unanswered = run(_measure_step)
    model, batch, loss, opt_class = _case(name)
    inputs, targets = batch(B, "cpu")
    report = fxmem.analyze(model, inputs, targets, loss=loss, optimizer=opt_class,
                           device="cuda")
    d = report.runs_on_device(B, TOTAL_BYTES)
    return {"measured": measured, "unanswered": unanswered,
            "predicted": {"max_allocated": d.max_allocated, "max_reserved": d.max_reserved}}


def _events(snapshot) -> list:
    """(action, bytes, the innermost frame outside torch) of the recorded step."""
    out = []
    for e in snapshot["device_traces"][0]:
        frame = next((f for f in e.get("frames", ())
                      if "site-packages/torch" not in f["filename"]), None)
        out.append([e["action"], e["size"],
                    frame and f"{frame['filename'][-50:]}:{frame['line']}"])
    return out


def predict(name: str, batches: list, compiled_at: int, compile: bool = True,
            budget: float | None = None, checkpoint: list | None = None) -> dict:
    """fxmem's prediction of the same step (traced at ``compiled_at``) at each B: of
    ``torch.compile(model)``, or with ``budget`` of the model with
    ``compile={"activation_memory_budget": budget}``; under the ``checkpoint`` plan."""
    import fxmem

    model, batch, loss, opt_class = _case(name)
    inputs, targets = batch(compiled_at, "cpu")
    amp = AMP.get(name)
    if budget is not None:
        report = fxmem.analyze(model, inputs, targets, loss=loss, optimizer=opt_class,
                               device="cuda", compile={"activation_memory_budget": budget},
                               amp=amp)
    else:
        report = fxmem.analyze(torch.compile(model) if compile else model, inputs, targets,
                               loss=loss, optimizer=opt_class, device="cuda", amp=amp,
                               checkpoint=checkpoint)
    return {str(b): {"max_allocated": report.cuda_memory(b).max_allocated,
                     "max_reserved": report.cuda_memory(b).max_reserved} for b in batches}


def part_modules(name: str, compiled_at: int) -> dict:
    """The module paths fxmem's trace of case ``name`` names its ops by, and whether the
    same model analysed again in this process (its parts' dynamo caches holding the first
    trace's entries) gives the same peak formula."""
    import fxmem

    model, batch, loss, opt_class = _case(name)
    inputs, targets = batch(compiled_at, "cpu")
    first, again = (fxmem.analyze(model, inputs, targets, loss=loss, optimizer=opt_class,
                                  device="cuda") for _ in range(2))
    return {"modules": sorted({o.module for o in first.trace.ops}),
            "again": str(first.peak) == str(again.peak)}


def estimates(name: str, compiled_at: int, compile: bool = True) -> dict:
    """Inductor's estimate and fxmem's of each compiled graph's run of case ``name``
    (fxmem.report.inductor), and the line a report's setup shows."""
    import fxmem
    from fxmem.report.inductor import graph_estimates
    from fxmem.report.summary import summarize

    model, batch, loss, opt_class = _case(name)
    inputs, targets = batch(compiled_at, "cpu")
    report = fxmem.analyze(torch.compile(model) if compile else model, inputs, targets,
                           loss=loss, optimizer=opt_class, device="cuda", amp=AMP.get(name))
    return {"runs": [[e.phase, e.first_op, e.last_op, e.B, e.inductor_bytes, e.fxmem_bytes]
                     for e in graph_estimates(report.trace)],
            "line": summarize(report, B=compiled_at).setup.get("inductor's estimate")}


def measure_with_fxmem(name: str, B: int, compiled_at: int, budget: float) -> dict:
    """``fxmem.measure(..., compile={"activation_memory_budget": budget})`` of the same step:
    the example batch at ``compiled_at``, measured at ``B``."""
    import fxmem

    model, batch, loss, opt_class = _case(name)
    inputs, targets = batch(compiled_at, "cpu")
    m = fxmem.measure(model, inputs, targets, loss=loss, optimizer=opt_class, device="cuda",
                      B=B, compile={"activation_memory_budget": budget})
    return {"max_allocated": m.peak_bytes, "max_reserved": m.peak_reserved_bytes}


def measure_with_fxmem_each(batches: list, **kw) -> dict:
    """:func:`measure_with_fxmem` at each of ``batches`` in turn: {str(B): figures}."""
    return _each(batches, lambda b: measure_with_fxmem(B=b, **kw))


class Breaks(nn.Module):
    """A graph break: a Python print between two linears."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x):
        h = self.a(x)
        print("between the graphs")
        return self.b(h)


def graph_break() -> str:
    """What fxmem says of a compiled model with a graph break."""
    import fxmem

    try:
        fxmem.analyze(torch.compile(Breaks()), torch.zeros(4, 8), loss=square_sum,
                      device="cuda")
    except fxmem.TraceError as e:
        return str(e)
    return ""


def cli_and_api(budget: float, B: int) -> dict:
    """``fxmem analyze ... --compile --compile-budget`` on the pointwise model, and the API's
    ``compile=`` prediction of the same step: (the CLI's setup row, its max_allocated, the
    API's) at ``B``, and the modules the API's trace puts each of inductor's buffers and each
    of its calls into cuBLAS (``extern_kernels.mm``) in, by phase."""
    import json

    from click.testing import CliRunner

    import fxmem
    from fxmem.cli import cli

    r = CliRunner().invoke(cli, [
        "analyze", f"{__file__}:Pointwise", "--input", "B,256", "--target", "B,256",
        "--loss", "mse", "--compile", "--compile-budget", str(budget), "--batch", str(B),
        "--format", "json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    api = fxmem.analyze(Pointwise(), torch.zeros(B, 256), torch.zeros(B, 256),
                        loss=torch.nn.functional.mse_loss, optimizer=None, device="cuda",
                        compile={"activation_memory_budget": budget})  # (compiled at B)
    buffers, library = {}, {}
    for o in api.trace.ops:
        if o.op == "aten.empty_strided.default":
            buffers.setdefault(o.phase, set()).add(o.module)
        if o.op.split(".")[1] in ("mm", "addmm") and o.phase in ("forward", "backward"):
            library.setdefault(o.phase, set()).add(o.module)
    return {"setup": report["setup"].get("compiled"),
            "cli": report["cuda"]["max_allocated"], "api": api.cuda_memory(B).max_allocated,
            "buffers": {k: sorted(v) for k, v in buffers.items()},
            "library": {k: sorted(v) for k, v in library.items()}}


def cli_auto(B: int, slacks: list) -> list:  # noqa: N803
    """``fxmem analyze ... --compile --checkpoint auto --budget`` on the pointwise model,
    each budget the replayed ``max_memory_reserved()`` of the step compiled under budget 1.0
    plus one of ``slacks`` (bytes): the CLI's exit code, setup row, frontier budgets,
    ``max_allocated`` and the ways it found none of, and the API's choice among eager plans
    and compile budgets (``kinds=[..., "compiled"]``) within that budget."""
    import json

    from click.testing import CliRunner

    import fxmem
    from fxmem.checkpoint.compiled import compiled_plans
    from fxmem.checkpoint.options import KINDS
    from fxmem.cli import cli

    eager = fxmem.analyze(Pointwise(), torch.zeros(B, 256), torch.zeros(B, 256),
                          loss=torch.nn.functional.mse_loss, optimizer=None, device="cuda")
    kinds = [*KINDS, "compiled"]
    out = []
    for slack in slacks:
        budget = compiled_plans(eager, (1.0,))[0].report.cuda_memory(B).max_reserved + slack
        try:
            api = eager.plan_for(budget, B, kinds=kinds)
            chosen = {"compiled": api.compiled,
                      "max_allocated": api.report.cuda_memory(B).max_allocated}
        except fxmem.InfeasibleBudgetError as e:
            chosen = {"minimum_bytes": e.minimum_bytes}
        r = CliRunner().invoke(cli, [
            "analyze", f"{__file__}:Pointwise", "--input", "B,256", "--target", "B,256",
            "--loss", "mse", "--compile", "--checkpoint", "auto", "--batch", str(B),
            "--budget", str(budget), "--format", "json"])
        report = json.loads(r.stdout)
        out.append({"exit": r.exit_code, "setup": report["setup"].get("compiled"),
                    "frontier": [p["compiled"] for p in report["frontier"]],
                    "max_allocated": report["cuda"]["max_allocated"],
                    "none": report["fit"]["none"], "api": chosen})
    return out


def graph_flops(name: str, compiled_at: int, budget: float) -> int:
    """FLOPs of the forward and backward graphs AOTAutograd's partitioner hands inductor
    for case ``name`` compiled under ``budget`` at ``compiled_at`` (static shapes), by
    ``torch.utils.flop_counter``'s formulas applied to each node's fake-tensor metadata:
    counted on PyTorch's graphs, not on fxmem's trace."""
    from torch._functorch import config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner
    from torch.utils._pytree import tree_map_only
    from torch.utils.flop_counter import flop_registry

    graphs = []

    def inner(gm, example_inputs, **kwargs):
        graphs.append(gm)
        return compile_fx_inner(gm, example_inputs, **kwargs)

    def backend(gm, example_inputs):
        return compile_fx(gm, example_inputs, inner_compile=inner)

    torch.manual_seed(0)
    model, batch, loss, _ = _case(name)
    model = model.cuda()
    torch._dynamo.reset()
    with config.patch(activation_memory_budget=budget, enable_autograd_cache=False):
        run = torch.compile(model, backend=backend, dynamic=False)
        inputs, targets = batch(compiled_at, "cuda")
        loss(run(*inputs), *targets).backward()
    torch._dynamo.reset()
    total = 0
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
                continue
            formula = flop_registry.get(node.target.overloadpacket)
            if formula is not None:
                args, kwargs = tree_map_only(torch.fx.Node, lambda a: a.meta["val"],
                                             (node.args, node.kwargs))
                total += int(formula(*args, **kwargs, out_val=node.meta["val"]))
    return total


def compiled_plans(name: str, batches: list, compiled_at: int, budgets: list) -> dict:
    """fxmem's planner with compiled budgets as a kind, on the eager analysis of case
    ``name`` (traced at ``compiled_at``): per budget, its candidate's predicted CUDA peaks at
    each B and recompute FLOPs at ``compiled_at``; the frontier of ``kinds=["compiled"]`` at
    the last B; ``plan_for`` with each candidate's peak as the budget; and the FLOPs of
    PyTorch's partitioned graphs under each budget (:func:`graph_flops`)."""
    import fxmem

    model, batch, loss, opt_class = _case(name)
    inputs, targets = batch(compiled_at, "cpu")
    report = fxmem.analyze(model, inputs, targets, loss=loss, optimizer=opt_class,
                           device="cuda")
    b = batches[-1]
    out = {"frontier": [[p.peak_bytes, p.recompute_flops, p.compiled, list(p.plan)]
                        for p in report.frontier(b, kinds=["compiled"])],
           "budgets": {}}
    from fxmem.checkpoint.compiled import compiled_plans as plans

    for p in plans(report, budgets):
        choice = report.plan_for(p.peak_bytes(b), b, kinds=["compiled"], by="live")
        out["budgets"][str(p.budget)] = {
            "cuda": {str(x): {"max_allocated": p.report.cuda_memory(x).max_allocated,
                              "max_reserved": p.report.cuda_memory(x).max_reserved}
                     for x in batches},
            "peak_bytes": p.peak_bytes(b),
            "recompute_flops": p.recompute_flops_at(compiled_at),
            "recompute_flops_at_b": p.recompute_flops_at(b),
            "graph_flops": graph_flops(name, compiled_at, p.budget),
            "chosen": [choice.compiled, choice.peak_bytes, choice.recompute_flops]}
    return out


def cli_short_llama(B: int, L: int) -> dict:  # noqa: N803
    """``fxmem analyze hf:llama-3.1-8b --config num_hidden_layers=2 --amp bf16 --compile``
    at ``--batch B --seq L`` (AdamW, H100-80GB): its exit code and last line. At B=2 and
    L=512 inductor's kernels for the step compiled at B=8 hold from 1,280 tokens (B*L) on,
    so the asked point is only within a trace compiled at the asked batch."""
    from click.testing import CliRunner

    from fxmem.cli import cli

    r = CliRunner().invoke(cli, [
        "analyze", "hf:llama-3.1-8b", "--config", "num_hidden_layers=2", "--optimizer",
        "adamw", "--amp", "bf16", "--batch", str(B), "--seq", str(L), "--gpu", "H100-80GB",
        "--compile", "--format", "json"])
    return {"exit": r.exit_code, "last": (r.output.strip().splitlines() or [""])[-1]}
