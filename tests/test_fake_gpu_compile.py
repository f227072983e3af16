"""Compiled steps (issue 39): ``fxmem.analyze(torch.compile(model), ...)`` traces inductor's
own code (fxmem.trace.compiled.inductor), checked against the same compiled step run on the fake GPU
(tests/fakegpu_compile_targets.py: PyTorch alone). Each case is compiled once with B
dynamic at its ``compiled_at`` batch size, then run at two other batch sizes.

The measured runs load their graphs from inductor's cache, filled by one run before them in
a cache folder of this module's own: a process that compiles a graph cold can end with
another ``max_reserved`` (docs/compiled.md, "Not yet"), and which one a run is must not
depend on what an earlier run left in the machine's cache."""

import os
import sys

import pytest
import torch

from fakegpu_marks import FAKE_GPU

pytestmark = FAKE_GPU
BUDGETS = (1.0, 0.7, 0.5, 0.3)  # fxmem.checkpoint.compiled.BUDGETS, the kind's candidates
HERE = os.path.dirname(os.path.abspath(__file__))
# case -> (compiled at, the batch sizes checked; gpt2_bf16: GPT-2 under bf16 autocast); GPT-2
# compiles for about a minute: in the slow tier, which CI does not run
CASES = {"pointwise": (1024, (8, 512)), "gpt2": (64, (4, 32)), "gpt2_bf16": (64, (4, 32)),
         **{f"blocks_{how}": (1024, (8, 512))
            for how in ("each", "checkpointed", "wrapped", "in_place", "model", "eager",
                        "checkpointed_in_place")}}
_seen: dict = {}
_cache: list = []


@pytest.fixture(scope="module", autouse=True)
def _remove_the_cache():
    """The module's inductor cache folder goes with the module (tens of MB each)."""
    yield
    import shutil

    for folder in _cache:
        shutil.rmtree(folder, ignore_errors=True)
    _cache.clear()


def _call(fn, **kwargs):
    import tempfile

    from fxmem.validate.fakegpu.run import call

    if not _cache:
        _cache.append(tempfile.mkdtemp(prefix="fxmem_inductor_"))
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=_cache[0])
    return call(sys.executable, f"fakegpu_compile_targets:{fn}", kwargs=kwargs,
                sys_path=[HERE], env=env)


def _figures(name, compile=True, budget=None):
    """(predicted, measured): {B: {"max_allocated", "max_reserved"}}, once per case."""
    if (name, compile, budget) not in _seen:
        at, batches = CASES[name]
        kw = dict(name=name, compiled_at=at, compile=compile, budget=budget)
        predicted = _call("predict", batches=list(batches), **kw)
        _call("measure", B=at, **kw)  # fills the cache
        measured = _call("measure_each", batches=list(batches), **kw)
        _seen[name, compile, budget] = predicted, measured
    return _seen[name, compile, budget]


@pytest.mark.parametrize("name", ["pointwise", "blocks_wrapped",
                                  pytest.param("gpt2", marks=pytest.mark.slow),
                                  pytest.param("gpt2_bf16", marks=pytest.mark.slow)])
def test_compiled_step_is_exact_on_the_fake_gpu(name):
    """The model compiled whole (``blocks_wrapped``: its blocks in ``checkpoint_wrapper``,
    whose checkpoint dynamo captures into the graph: the trace installs none of its own)."""
    predicted, measured = _figures(name)
    assert predicted == measured


@pytest.mark.parametrize("how", ["each", "in_place", "model"])
def test_parts_compiled_on_their_own_are_exact_on_the_fake_gpu(how):
    """Blocks compiled one by one, ``torch.compile(block)`` put back in the model (as
    torchtitan did) or ``block.compile()`` (as it does now), and a model compiled in place
    (``model.compile()``): each part's graphs lowered and run on the trace's fakes, the eager
    code between them traced as any step's (fxmem.trace.compiled.parts). Exact at two batch
    sizes, and not the eager step's."""
    name = f"blocks_{how}"
    predicted, measured = _figures(name, compile=False)
    assert predicted == measured
    eager = _figures("blocks_eager", compile=False)
    b = str(CASES[name][1][-1])
    assert measured[b]["max_allocated"] < eager[1][b]["max_allocated"]
    assert eager[0] == eager[1]


def test_blocks_checkpointed_inside_their_compile_are_exact_on_the_fake_gpu():
    """Each block ``torch.compile(checkpoint_wrapper(block))``, torchtitan's activation
    checkpointing then compile: the checkpoint is dynamo's (a higher-order op in the graph,
    the partitioner re-running the block's forward in its backward graph), so the trace
    lowers the part as it is, installing none of its own checkpointing on the wrapper.
    Exact at two batch sizes, and not the blocks compiled without it."""
    predicted, measured = _figures("blocks_checkpointed", compile=False)
    assert predicted == measured
    plain = _figures("blocks_each", compile=False)[1]
    assert measured["512"]["max_allocated"] < plain["512"]["max_allocated"]


def test_a_plan_over_parts_compiled_on_their_own_is_their_checkpoint_in_the_compile():
    """fxmem's plan ``checkpoint=["layers.0", "layers.1"]`` over the blocks
    ``torch.compile(block)`` put back lowers each part as
    ``torch.compile(checkpoint_wrapper(block))`` is: the step the fake GPU measured for
    that model (``blocks_checkpointed``), exactly, at two batch sizes."""
    at, batches = CASES["blocks_checkpointed"]
    planned = _call("predict", name="blocks_each", compiled_at=at, compile=False,
                    batches=list(batches), checkpoint=["layers.0", "layers.1"])
    assert planned == _figures("blocks_checkpointed", compile=False)[1]


def test_a_plan_over_blocks_compiled_in_place_is_torchtitan_s_recipe():
    """The same plan over blocks compiled in place (``block.compile()``, as torchtitan does
    now) is traced as torchtitan's recipe runs: each block ``checkpoint_wrapper(block)``,
    then ``.compile()`` on the wrapper (``blocks_checkpointed_in_place``, measured on the
    fake GPU), exactly, at two batch sizes, and not the blocks without the plan. It had been
    refused ("module layers.0 is compiled in place (block.compile()): plans over it are not
    modelled yet")."""
    at, batches = CASES["blocks_checkpointed_in_place"]
    planned = _call("predict", name="blocks_in_place", compiled_at=at, compile=False,
                    batches=list(batches), checkpoint=["layers.0", "layers.1"])
    measured = _figures("blocks_checkpointed_in_place", compile=False)[1]
    assert planned == measured
    plain = _figures("blocks_in_place", compile=False)[1]
    assert measured["512"]["max_allocated"] < plain["512"]["max_allocated"]


def test_a_part_s_buffers_count_below_its_path():
    """What a block's graphs allocate, forward and backward, counts for the modules of that
    block (by the names its parameters have: ``_orig_mod`` within ``torch.compile(block)``),
    not for paths within the compiled module alone ("inner.a"); a second analysis in the
    process, past the parts' cached graphs, gives the same formula."""
    got = _call("part_modules", name="blocks_each", compiled_at=64)
    assert {"layers.0._orig_mod.inner.a", "layers.1._orig_mod.inner.b"} <= \
        set(got["modules"]), got
    assert not [m for m in got["modules"] if m.startswith("inner")], got
    assert got["again"]  # analysed again in the process: the same formula
    got = _call("part_modules", name="blocks_in_place", compiled_at=64)
    assert {"layers.0.inner.a", "layers.1.inner.b"} <= set(got["modules"]), got
    assert got["again"]


def test_inductor_s_own_estimate_is_shown_beside_fxmem_s():
    """Each compiled graph's run with inductor's estimate of its peak (torch._inductor.memory,
    at the batch size it compiled at) and fxmem's of the same bytes, in the report's setup.
    The forward graph of ``pointwise`` frees nothing it was given: there the two count the
    same buffers, and agree to the byte; a model compiled block by block runs a graph per
    block, summarised by its largest."""
    got = _call("estimates", name="pointwise", compiled_at=1024)
    assert [r[0] for r in got["runs"]] == ["forward", "backward"], got
    (_, first, last, b, theirs, ours), back = got["runs"]
    assert b == 1024 and 0 <= first < last < back[1] <= back[2]
    assert theirs == ours > 0, got  # the forward: the same buffers
    assert back[4] > 0 and back[5] > 0
    assert got["line"].startswith("forward graph at B=1024: inductor "), got["line"]
    got = _call("estimates", name="blocks_each", compiled_at=1024, compile=False)
    assert [r[0] for r in got["runs"]] == ["forward"] * 2 + ["backward"] * 2, got
    assert "forward graphs (2 runs) at B=1024: inductor up to" in got["line"], got["line"]


def test_compiled_and_eager_steps_differ():
    """The case tells the two apart: at B=512 inductor's fused chain holds less than eager's
    outputs, and each prediction is its own step's."""
    compiled, eager = _figures("pointwise")[1], _figures("pointwise", compile=False)
    b = str(CASES["pointwise"][1][-1])
    assert compiled[b]["max_allocated"] < eager[1][b]["max_allocated"]
    assert eager[0] == eager[1]


def test_an_eager_llama_without_a_cache_is_exact_on_the_fake_gpu():
    """A causal LM called with no attention mask and no cache (``use_cache=False``) asks
    transformers' ``find_packed_sequence_indices``, a value a kernel computes. Answered as
    a GPU answers it (``measure_step`` runs an eager step within ``gpu_answers``), the whole
    run of three steps from a fresh start (``benchmarks/compiled_peers.py``'s) is fxmem's
    ``runs_on_device``. Unanswered, the fake GPU reads 0, builds the 4-D mask and SDPA
    keeps a float bias per layer for the backward: more than a GPU holds."""
    got = _call("whole_run", name="llama_nocache", B=8)
    assert got["measured"] == got["predicted"]
    assert got["unanswered"]["max_allocated"] > got["measured"]["max_allocated"]


def test_a_graph_break_is_named():
    """The eager code between two graphs would run unseen by the trace: refused, in one line
    naming dynamo's reason."""
    message = _call("graph_break")
    assert "graph break" in message and "fullgraph=True" in message and "\n" not in message


def test_compile_option_at_a_partitioner_budget_is_exact_on_the_fake_gpu():
    """``compile={"activation_memory_budget": 0.5}``: the partitioner recomputes more and
    saves less; predicted equal to the step compiled under that budget with PyTorch alone,
    and to ``fxmem.measure`` with the same option, at both B."""
    predicted, measured = _figures("pointwise", budget=0.5)
    assert predicted == measured
    assert predicted != _figures("pointwise")[0]  # the budget changes the compiled step
    at, batches = CASES["pointwise"]
    by_fxmem = _call("measure_with_fxmem_each", batches=list(batches), name="pointwise",
                     compiled_at=at, budget=0.5)
    assert by_fxmem == measured


def test_the_command_line_compiles_with_a_budget():
    """``fxmem analyze --compile --compile-budget 0.5`` says so in its setup and gives the
    API's ``compile=`` figure; the buffers of the compiled graphs, and their library calls,
    are the modules' they came from."""
    got = _call("cli_and_api", budget=0.5, B=64)
    assert got["setup"] == "torch.compile, activation_memory_budget 0.5"
    assert got["cli"] == got["api"] > 0
    # each of inductor's buffers belongs to the module its code came from: the linears' own
    # in both graphs (the backward's from AOTAutograd's copy of the forward's module stack),
    # the fused chain between them the model's
    for phase in ("forward", "backward"):
        assert {"a", "b"} <= set(got["buffers"][phase]) <= {"", "a", "b"}, got["buffers"]
    # and so does each call into cuBLAS the wrappers make, with what it allocates (its
    # workspace), not the module around the compiled graph
    for phase in ("forward", "backward"):
        assert set(got["library"][phase]) == {"a", "b"}, got["library"]


@pytest.mark.slow  # four compiles of the pointwise model at two sizes: minutes
def test_compiled_budgets_are_plan_kinds():
    """``kinds=["compiled"]`` (fxmem.checkpoint.compiled): each ``torch.compile`` budget is a
    candidate of the eager analysis. Its CUDA peaks are those of the step compiled under that
    budget with PyTorch alone (measured on the fake GPU, the same runs as the tests above);
    its recompute FLOPs, those of PyTorch's partitioned graphs under it less budget 1.0's
    (counted on those graphs, not on fxmem's trace); the frontier holds no dominated point
    and dominates every candidate; ``plan_for`` at a candidate's peak is no dearer."""
    at, batches = CASES["pointwise"]
    got = _call("compiled_plans", name="pointwise", batches=list(batches), compiled_at=at,
                budgets=[0.5])
    cands = got["budgets"]
    assert sorted(cands) == ["0.5", "1.0"]
    assert cands["1.0"]["cuda"] == _figures("pointwise")[1]
    assert cands["0.5"]["cuda"] == _figures("pointwise", budget=0.5)[1]
    base = cands["1.0"]["graph_flops"]
    assert base > 0
    for c in cands.values():
        assert c["recompute_flops"] == c["graph_flops"] - base
    front = got["frontier"]  # over the four default budgets, of which two are checked here
    assert front and all(p[3] == [] and p[2] in BUDGETS for p in front)
    assert all(a[0] > b[0] and a[1] < b[1] for a, b in zip(front, front[1:]))
    for c in cands.values():
        assert any(p[0] <= c["peak_bytes"] and p[1] <= c["recompute_flops_at_b"]
                   for p in front)
        budget, peak, flops = c["chosen"]
        assert budget in BUDGETS
        assert peak <= c["peak_bytes"] and flops <= c["recompute_flops_at_b"]


@pytest.mark.slow
def test_the_command_line_compiles_at_the_asked_batch():
    """A compiled step's example batch on the command line is ``--batch``, as a run
    compiles at its own: a 2-layer Llama 3.1 8B at B=2, L=512 had been traced compiled at
    B=8, whose kernels hold from 1,280 tokens on, and ended in "B=2, L=512 is outside where
    the trace holds (4096*B*L >= 5242880)" at exit 2."""
    got = _call("cli_short_llama", B=2, L=512)
    assert got["exit"] == 0, got


@pytest.mark.skipif(not torch.__version__.startswith("2.14."), reason="the command's "
                    "plumbing, not a release's binary: checked on CI's 2.14.1 alone")
def test_checkpoint_auto_with_compile_chooses_among_compile_budgets():
    """``fxmem analyze --compile --checkpoint auto``: the step analysed eager, its plans and
    the ``torch.compile`` budgets compared (``kinds=[..., "compiled"]``); the report is the
    API's choice, its setup row names the budget, its frontier's points theirs. Within the
    replayed ``max_memory_reserved()`` of budget 1.0's step it fits; 4 MiB under, it does
    not, and the ways out give what the least of them needs."""
    fits, short = _call("cli_auto", B=512, slacks=[0, -(4 << 20)])
    assert fits["exit"] == 0 and fits["api"]["compiled"] in BUDGETS
    assert fits["setup"] == (f"torch.compile, activation_memory_budget "
                             f"{fits['api']['compiled']:g} (--checkpoint auto)")
    assert fits["max_allocated"] == fits["api"]["max_allocated"]
    assert fits["frontier"] and all(c in BUDGETS or c is None for c in fits["frontier"])
    assert short["exit"] == 4 and "minimum_bytes" in short["api"]
    need = short["api"]["minimum_bytes"]
    assert any(f"replayed with no limit, is {need / 2**20:.2f} MiB" in n for n in short["none"])
