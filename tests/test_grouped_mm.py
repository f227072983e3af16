"""``aten._grouped_mm`` (``F.grouped_mm``; transformers' MoE experts by default): PyTorch's
meta kernel refuses float32, which its CPU and CUDA kernels take, and lays the output out
otherwise than they do on a CPU build (fxmem.trace.kernels.rules.grouped_mm_meta). The meta fxmem
traces with is checked against the installed kernel on real tensors, and MoE layers, routed
with fixed shapes, against real CPU steps; an expert loop whose sizes come from the routing is
refused with a message saying what to do."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import fxmem
from fxmem.checkpoint.options import counted_flops
from fxmem.trace.kernels.datadep import EAGER_EXPERTS
from fxmem.trace.kernels.rules import grouped_mm_meta

KW = {"loss": lambda o: o.float().sum(), "optimizer": torch.optim.Adam}
BATCHES = (2, 3, 5)  # the trace is at B = 4
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _layouts(dtype, n):
    """(mat_a, mat_b, offs) for each layout the kernel takes; ``n`` output columns (not a
    multiple of 16 bytes: the kernel pads the rows). Weights column-major, as transformers
    passes ``weight.transpose(-2, -1)``."""
    offs = torch.tensor([2, 4, 6, 8], dtype=torch.int32)
    w3 = torch.randn(4, n, 16, dtype=dtype).transpose(-2, -1)  # (4, 16, n)
    return {
        "2d-3d": (torch.randn(8, 16, dtype=dtype), w3, offs),
        "3d-2d": (torch.randn(4, 8, 16, dtype=dtype), torch.randn(n, 16, dtype=dtype).t(),
                  offs),
        "2d-2d": (torch.randn(16, 8, dtype=dtype), torch.randn(n, 8, dtype=dtype).t(), offs),
        "3d-3d": (torch.randn(4, 8, 16, dtype=dtype), w3, None),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [32, 30])
@pytest.mark.parametrize("layout", ["2d-3d", "3d-2d", "2d-2d", "3d-3d"])
def test_the_meta_makes_what_the_kernel_makes(dtype, n, layout):
    a, b, offs = _layouts(dtype, n)[layout]
    real = torch._grouped_mm(a, b, offs=offs)
    with torch.device("meta"):
        meta = grouped_mm_meta(a.to("meta"), b.to("meta"),
                               None if offs is None else offs.to("meta"))
    assert (meta.shape, meta.stride(), meta.dtype) == (real.shape, real.stride(), real.dtype)
    assert meta.untyped_storage().nbytes() == real.untyped_storage().nbytes()


def test_the_meta_refuses_what_the_kernel_refuses():
    a, b, offs = _layouts(torch.float32, 32)["2d-3d"]
    for x, y in ((a.double(), b.double()), (a, b[:, :8])):
        with pytest.raises(RuntimeError) as real:
            torch._grouped_mm(x, y, offs=offs)
        with pytest.raises(RuntimeError) as meta:
            grouped_mm_meta(x.to("meta"), y.to("meta"), offs.to("meta"))
        assert str(meta.value).split(",")[0] == str(real.value).split(",")[0]


class GroupedExperts(nn.Module):
    """A top-2 MoE layer routed with fixed shapes, as transformers' ``grouped_mm`` experts:
    tokens sorted by expert, offsets from a histogram, one grouped GEMM up, one down."""

    def __init__(self, d=16, hidden=32, experts=4, k=2):
        super().__init__()
        self.router = nn.Linear(d, experts)
        self.up = nn.Parameter(torch.randn(experts, hidden, d) / 4)
        self.down = nn.Parameter(torch.randn(experts, d, hidden) / 4)
        self.experts, self.k = experts, k

    def forward(self, x):
        b, t, d = x.shape
        h = x.reshape(-1, d)
        weights, ids = self.router(h).softmax(-1).topk(self.k, dim=-1)
        ids, perm = ids.reshape(-1).sort()
        g = h[perm // self.k]
        counts = torch.histc(ids.float(), bins=self.experts, min=0, max=self.experts - 1)
        offs = counts.cumsum(0, dtype=torch.int32)
        y = F.silu(torch._grouped_mm(g, self.up.transpose(-2, -1), offs=offs))
        y = torch._grouped_mm(y, self.down.transpose(-2, -1), offs=offs)
        y = y * weights.reshape(-1)[perm, None]
        out = torch.empty_like(y)
        out[perm] = y
        return out.view(b * t, self.k, d).sum(1).view(b, t, d)


class LoopedExperts(GroupedExperts):
    """The same layer as a loop over the experts the tokens were routed to: each expert's
    batch is as large as the routing makes it (transformers' ``eager`` experts)."""

    def forward(self, x):
        b, t, d = x.shape
        h = x.reshape(-1, d)
        weights, ids = self.router(h).softmax(-1).topk(self.k, dim=-1)
        out = torch.zeros_like(h)
        for e in ids.unique():
            tok, slot = torch.where(ids == e)
            y = F.silu(h[tok] @ self.up[e].t()) @ self.down[e].t()
            out.index_add_(0, tok, y * weights[tok, slot, None])
        return out.view(b, t, d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_grouped_mm_moe_step_is_exact(dtype):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), GroupedExperts(), GroupedExperts()).to(dtype)
    x = torch.randn(4, 6, 16, dtype=dtype)
    r = fxmem.analyze(model, x, device="cpu", **KW)
    assert "aten._grouped_mm.default" in {op.op for op in r.trace.ops}
    for b in BATCHES:
        assert r.peak_bytes(b) == fxmem.measure(model, x, B=b, **KW).peak_bytes, b


def test_grouped_experts_cost_the_flops_of_the_looped_experts_matmuls():
    """PyTorch's FLOP registry has no formula for ``aten._grouped_mm``: fxmem counted the
    experts' matmuls as nothing, so re-running them was free to the planner (Qwen3-30B-A3B
    over 8 GPUs: "re-running 0.0%"). fxmem's count (fxmem.checkpoint.flops.grouped_mm_flop)
    against PyTorch's FlopCounterMode over the same layers run for real as a loop over
    their experts (``torch.mm`` on the routing's own batch sizes), forward and backward."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), GroupedExperts(), GroupedExperts())
    x = torch.randn(4, 6, 16)
    r = fxmem.analyze(model, x, device="cpu", **KW)
    assert "aten._grouped_mm.default" not in dict(r.flop_count.uncounted)
    looped = nn.Sequential(nn.Linear(16, 16), LoopedExperts(), LoopedExperts())
    looped.load_state_dict(model.state_dict())
    with FlopCounterMode(display=False) as seen:
        KW["loss"](looped(x)).backward()
    assert counted_flops(r, 4) == seen.get_total_flops() > 0


def test_experts_sized_by_the_routing_are_refused_with_what_to_do():
    model = nn.Sequential(nn.Linear(16, 16), LoopedExperts())
    with pytest.raises(fxmem.DataDependentError) as e:
        fxmem.analyze(model, torch.randn(4, 6, 16), device="cpu", **KW)
    assert "\n" not in str(e.value) and "test_grouped_mm.py" in e.value.source


def _mixtral(**kw):
    T = pytest.importorskip("transformers")
    cfg = T.MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                          num_local_experts=4, num_experts_per_tok=2, **kw)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = T.MixtralForCausalLM(cfg)

        def forward(self, ids):
            return self.model(input_ids=ids, labels=ids).loss

    torch.manual_seed(0)
    return LM(), torch.randint(0, 64, (4, 8))


def test_transformers_eager_experts_are_refused_naming_the_implementations_to_use():
    m, ids = _mixtral()
    m.model.set_experts_implementation("eager")
    with pytest.raises(fxmem.DataDependentError) as e:
        fxmem.analyze(m, ids, device="cpu", loss=None, optimizer=torch.optim.Adam)
    assert e.value.reason.endswith(EAGER_EXPERTS) and "\n" not in str(e.value)
    assert e.value.module == "model.model.layers.0.mlp.experts"


@pytest.mark.parametrize("impl", ["grouped_mm", "batched_mm"])
def test_transformers_moe_experts_match_measure(impl):
    m, ids = _mixtral()
    if impl != "grouped_mm":
        m.model.set_experts_implementation(impl)
    assert m.model.config._experts_implementation == impl  # grouped_mm: transformers' default
    kw = {"loss": None, "optimizer": torch.optim.Adam}
    r = fxmem.analyze(m, ids, device="cpu", **kw)
    for b in BATCHES:
        assert r.peak_bytes(b) == fxmem.measure(m, ids, B=b, **kw).peak_bytes, b


@pytest.mark.parametrize("dtype, capability, listed", [
    (torch.bfloat16, (9, 0), True), (torch.bfloat16, (10, 0), True),
    (torch.bfloat16, (8, 0), False), (torch.float32, (9, 0), False)])
def test_cutlass_grouped_gemm_temporaries_are_listed_on_cuda(dtype, capability, listed):
    """On CUDA the output is the CPU's; CUTLASS's fast path (bfloat16, sm90/sm100) also
    allocates an argument buffer and a workspace that only CUTLASS sizes: named, not hidden."""
    model = GroupedExperts().to(dtype)
    r = fxmem.analyze(model, torch.randn(4, 6, 16, dtype=dtype), device="cuda",
                      compute_capability=capability, **KW)
    ops = {op for op, _, _ in r.unmodelled}
    assert ("aten._grouped_mm.default" in ops) == listed
