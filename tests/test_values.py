"""Values a model reads that do not depend on data (fxmem.trace.kernels.values): a mask the model
fills itself and branches on, as transformers' decoders do (``torch.ones(batch, seq)``, then
``_ignore_causal_mask_sdpa`` reads whether it is all ones and skips the mask). Each model is
traced at B = 4 and checked to the byte against a real eager CPU step at other batch sizes;
a branch on a read whose answer depends on B or on data is still refused."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import fxmem
from fxmem.trace.kernels.values import KnownValues, eager_branches

aten = torch.ops.aten
KW = {"loss": lambda o: o.float().sum(), "optimizer": torch.optim.Adam}
BATCHES = (2, 3, 5)  # the trace is at B = 4


def assert_exact(model, *x):
    r = fxmem.analyze(model, x, device="cpu", **KW)
    for b in BATCHES:
        assert r.peak_bytes(b) == fxmem.measure(model, x, B=b, **KW).peak_bytes, b
    return r


class SkipsItsMask(nn.Module):
    """Self-attention whose padding mask the forward makes (all ones) and reads: no padding,
    so eager calls SDPA with ``is_causal=True`` and no mask; otherwise it builds an additive
    (B, 1, L, L) float mask, kept for backward."""

    def __init__(self, d=16, read=lambda m: m.sum() == m.numel()):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.read = read

    def forward(self, x):
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)
        pad = torch.ones(x.shape[0], x.shape[1]).to(torch.bool)
        if self.read(pad):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        L = x.shape[1]
        causal = torch.ones(L, L, dtype=torch.bool).tril()
        allowed = causal[None, None] & pad[:, None, None, :]
        mask = torch.where(allowed, torch.tensor(0.0), torch.tensor(float("-inf")))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("read", [
    lambda m: m.sum() == m.numel(),  # transformers' fast_all: a sum over B*L elements
    lambda m: m.all(),
    lambda m: (~m).sum() == 0,
    lambda m: torch.all(m.long() == 1),
    lambda m: m[:, -1].float().mean().item() > 0.5,
], ids=["sum==numel", "all", "not-sum", "all-eq", "item"])
def test_a_mask_the_model_made_is_read_as_eager_reads_it(read):
    x = torch.randn(4, 8, 16)
    r = assert_exact(SkipsItsMask(read=read), x)
    assert "aten.where.self" not in {op.op for op in r.trace.ops}  # eager's branch: no mask


@pytest.mark.parametrize("read", [
    lambda m: m.sum() > 40,  # 8*B ones: more than 40 from B = 6 on
    lambda m: (m.masked_fill(torch.zeros_like(m), False)).all(),  # an op with no value rule
], ids=["depends-on-B", "no-rule"])
def test_a_read_not_decided_for_every_b_is_refused(read):
    with pytest.raises(fxmem.DataDependentError, match="branches on a value read"):
        fxmem.analyze(SkipsItsMask(read=read), torch.randn(4, 8, 16), device="cpu", **KW)


def test_a_write_forgets_the_value():
    def read(m):
        m = m.clone()
        m[0, 0] = False  # eager: not all ones any more
        return m.all()
    with pytest.raises(fxmem.DataDependentError, match="branches on a value read"):
        fxmem.analyze(SkipsItsMask(read=read), torch.randn(4, 8, 16), device="cpu", **KW)


def test_data_is_still_refused():
    class ReadsData(SkipsItsMask):
        def forward(self, x):
            self.read = lambda m: x.sum() > 0  # the input's values
            return super().forward(x)
    with pytest.raises(fxmem.DataDependentError, match="branches on a value read"):
        fxmem.analyze(ReadsData(), torch.randn(4, 8, 16), device="cpu", **KW)


def _symbolic_ones(env, mode, b=4, n=16):
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic
    s = env.create_symbol(b, source=ConstantSource("b"), dynamic_dim=DimDynamic.DYNAMIC)
    with mode:
        return torch.ones(env.create_symintnode(s, hint=b), n)


def test_known_values_follow_symbolic_sums_and_forget_writes():
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    known = KnownValues()
    t = _symbolic_ones(env, mode)
    with mode:
        known.update(aten.ones.default, (t.shape,), {}, t)
        s = aten.sum.default(t)
        known.update(aten.sum.default, (t,), {}, s)
        eq = aten.eq.Scalar(s, t.numel())
        known.update(aten.eq.Scalar, (s, t.numel()), {}, eq)
        gt = aten.gt.Scalar(s, 40)
        known.update(aten.gt.Scalar, (s, 40), {}, gt)
        assert known.read(eq) is True  # 16*B == 16*B for every B
        assert known.read(s) is NotImplemented  # 16*B: no one number
        assert known.value(gt) is None  # 16*B > 40 holds for B >= 3 only
        aten.fill_.Scalar(t, 0.0)
        known.update(aten.fill_.Scalar, (t, 0.0), {}, t)
        assert known.value(t) is None


def test_a_sum_of_an_unknown_value_is_not_counted(monkeypatch):
    # a sum over B elements of a tensor whose value is not known (an activation) learns
    # nothing: the number of elements each output sums (sympy in B) is not worked out
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    known = KnownValues()
    t = _symbolic_ones(env, mode)
    monkeypatch.setattr(KnownValues, "_count", staticmethod(
        lambda *a: pytest.fail("counted the elements of a sum of no known value")))
    with mode:
        s = aten.sum.dim_IntList(t, [0])
        known.update(aten.sum.dim_IntList, (t, [0]), {}, s)
        assert known.value(s) is None


def test_transformers_is_fake_tensor_answered_only_for_known_values():
    iu = pytest.importorskip("transformers.utils.import_utils")
    orig = iu.is_fake_tensor
    known = KnownValues()
    with FakeTensorMode():
        made, data = torch.ones(2, 3), torch.empty(2, 3)
        known.update(aten.ones.default, ((2, 3),), {}, made)
        with eager_branches(known):
            assert not iu.is_tracing(made)  # eager's branch: it reads the value
            assert iu.is_tracing(data)
    assert iu.is_fake_tensor is orig


def test_bart_decoder_skips_its_causal_mask_as_eager_does():
    T = pytest.importorskip("transformers")
    cfg = T.BartConfig(d_model=16, encoder_layers=1, decoder_layers=1,
                       encoder_attention_heads=2, decoder_attention_heads=2,
                       encoder_ffn_dim=32, decoder_ffn_dim=32, vocab_size=64,
                       max_position_embeddings=32)

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = T.BartForConditionalGeneration(cfg)

        def forward(self, ids):
            return self.model(input_ids=ids, labels=ids).loss

    torch.manual_seed(0)
    ids, m = torch.randint(0, 64, (4, 12)), Seq2Seq()
    r = fxmem.analyze(m, ids, device="cpu", loss=None, optimizer=torch.optim.Adam)
    for b in BATCHES:
        assert r.peak_bytes(b) == fxmem.measure(m, ids, B=b, loss=None,
                                                optimizer=torch.optim.Adam).peak_bytes, b


# -- positions: values affine in their indices (fxmem.trace.kernels.affine)
# ---------------------------

def _positions(x):
    """Positions as transformers' decoders make them: arange(L) + 0, expanded to the batch."""
    return (torch.arange(x.shape[1]) + 0).unsqueeze(0).expand(x.shape[0], -1)


def _packed(pos):
    """transformers' find_packed_sequence_indices (masking_utils.py): a new sequence wherever
    a position does not follow the one before."""
    diff = torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1)
    return (diff != 1).cumsum(-1)


class LooksForPackedSequences(nn.Module):
    """Self-attention that, as transformers does with no attention mask and no cache, looks
    for packed sequences in its positions: none (one sequence per row), so eager calls SDPA
    with ``is_causal=True``; otherwise it builds a (B, 1, L, L) block-causal mask."""

    def __init__(self, d=16, positions=_positions):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.positions = positions

    def forward(self, x):
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)
        packed = _packed(self.positions(x))
        if (packed[:, -1] == 0).all():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        L = x.shape[1]
        same = packed[:, None, :, None] == packed[:, None, None, :]
        mask = same & torch.ones(L, L, dtype=torch.bool).tril()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_positions_the_model_made_are_read_as_eager_reads_them():
    r = assert_exact(LooksForPackedSequences(), torch.randn(4, 8, 16))
    ops = {op.op for op in r.trace.ops}
    assert "aten.cumsum.default" in ops and "aten.bitwise_and.Tensor" not in ops


@pytest.mark.parametrize("positions", [
    lambda x: torch.cat([torch.arange(3), torch.arange(x.shape[1] - 3)]).expand(
        x.shape[0], -1),  # two sequences in each row: eager builds the mask
    lambda x: _positions(x) * (x[..., :1].squeeze(-1) > 0),  # positions set by data
], ids=["restarts", "data"])
def test_positions_not_known_to_follow_one_another_are_refused(positions):
    with pytest.raises(fxmem.DataDependentError, match="branches on a value read"):
        fxmem.analyze(LooksForPackedSequences(positions=positions), torch.randn(4, 8, 16),
                      device="cpu", **KW)


def test_affine_values_follow_views_cat_and_differences_and_forget_writes():
    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    known = KnownValues()
    b = _symbolic_ones(env, mode).shape[0]  # a symbolic batch size

    def run(op, *args, **kwargs):
        out = op(*args, **kwargs)
        known.update(op, args, kwargs, out)
        return out

    with mode:
        pos = run(aten.add.Tensor, run(aten.arange.start, 2, 10), 1)  # 3, 4, ..., 10
        rows = run(aten.expand.default, run(aten.unsqueeze.default, pos, 0), [b, -1])
        assert known.affine(rows) == (3, (0, 1)) and known.value(rows) is None
        assert known.value(run(aten.select.int, rows, 1, -1)) == 10
        first = run(aten.sub.Tensor, run(aten.slice.Tensor, rows, 1, 0, 1), 1)
        assert known.value(first) == 2
        both = run(aten.cat.default, [first, rows], 1)  # 2, 3, ..., 10: continues
        assert known.affine(both) == (2, (0, 1))
        step = run(aten.sub.Tensor, run(aten.slice.Tensor, both, 1, 1, 9),
                   run(aten.slice.Tensor, both, 1, 0, 8))
        assert known.value(step) == 1
        assert known.affine(run(aten.cumsum.default, step, 1)) == (1, (0, 1))
        gap = run(aten.cat.default, [rows, rows], 1)  # 3..10, 3..10: does not continue
        assert known.affine(gap) is None
        assert known.affine(run(aten.mul.Tensor, pos, pos)) is None  # quadratic
        tenths = run(aten.mul.Tensor, run(aten._to_copy.default, pos, dtype=torch.float32), 0.1)
        assert known.affine(tenths) is None  # float32 rounds each element
        aten.fill_.Scalar(pos, 0)
        known.update(aten.fill_.Scalar, (pos, 0), {}, pos)
        assert known.affine(pos) is None and known.affine(rows) is None


def test_llama_without_cache_skips_its_mask_as_eager_does():
    """transformers' decoders called with ``use_cache=False`` and no attention mask (a
    training step) look for packed sequences in their positions (masking_utils.py
    ``find_packed_sequence_indices``); eager finds none and builds no mask."""
    T = pytest.importorskip("transformers")
    cfg = T.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=2, vocab_size=64,
                        max_position_embeddings=64)

    class CausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = T.LlamaForCausalLM(cfg)

        def forward(self, ids):
            return self.model(input_ids=ids, labels=ids, use_cache=False).loss

    torch.manual_seed(0)
    ids, m = torch.randint(0, 64, (4, 12)), CausalLM()
    kw = {"loss": None, "optimizer": torch.optim.Adam}
    r = fxmem.analyze(m, ids, device="cpu", **kw)
    for b in BATCHES:
        assert r.peak_bytes(b) == fxmem.measure(m, ids, B=b, **kw).peak_bytes, b
    assert "aten.bitwise_and.Tensor" not in {op.op for op in r.trace.ops}
