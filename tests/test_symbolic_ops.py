"""Ops whose fake kernels used to fix the batch size, or fail on a symbolic one.

Every pattern is traced once at B = 4 and compared to the byte with a real eager CPU step
(``fxmem.measure``) at B = 2 and 5; ``device="cuda"`` must trace it too (CUDA's kernels, no
GPU needed). The causes, in :meth:`fxmem.trace.engine.recorder.Recorder.fake_kernel`: fake kernels
run without PyTorch's Python dispatcher reached C++ kernels that need concrete sizes
(``F.pad``'s ``constant_pad_nd``, inside ``F.unfold``/``F.fold``'s decompositions too, and
the C++ ``expand`` that ``baddbmm``'s and ``addcmul``'s Python meta kernels call); and
:data:`fxmem.trace.kernels.rules.STORAGE_AT_LEAST_INPUT_OPS` (im2col and col2im keep the larger of
their input's and output's storage).
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fxmem
from fxmem.formula.symbols import L
from fxmem.trace import trace
from fxmem.trace.kernels.cuda.workspaces import workspace_bytes

aten = torch.ops.aten
ADAM = dict(loss=lambda o: o.float().sum(), optimizer=torch.optim.Adam)


def exact(model, inputs, bs=(2, 5), **kw):
    """Analyze at B = 4 on CPU; the peak must equal the measured one at each of ``bs``; the
    step must trace for CUDA too. Returns the report."""
    r = fxmem.analyze(model, inputs, **kw, device="cpu")
    for b in bs:
        assert r.peak_bytes(b) == fxmem.measure(model, inputs, **kw, B=b).peak_bytes, b
    t = trace(model, inputs, **kw, device="cuda")
    assert any(s.size.expr.has(fxmem.B) for s in t.storages if s.category == "input")
    return r


# --- F.unfold / F.fold (aten.im2col / aten.col2im, each the other's backward) ---------------------

class Unfold(nn.Module):
    """The report's case: unfold, then a linear layer over each block."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(27, 8)

    def forward(self, x):
        return self.l(F.unfold(x, 3).transpose(1, 2))


class UnfoldFold(nn.Module):
    """TNT/VOLO-like: unfold with padding and stride, mix each block, fold back (overlapping
    blocks summed); the input needs a gradient, so backward runs col2im and im2col too."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Conv2d(3, 3, 1)
        self.l = nn.Linear(27, 27)

    def forward(self, x):
        u = F.unfold(self.pre(x), 3, padding=1, stride=2)
        u = self.l(u.transpose(1, 2)).transpose(1, 2)
        return F.fold(u, (8, 8), 3, padding=1, stride=2)


class FoldKept(nn.Module):
    """Fold of overlapping blocks, kept for backward: its storage has the columns' size."""

    def __init__(self):
        super().__init__()
        self.v = nn.Parameter(torch.randn(3, 8, 8))

    def forward(self, cols):
        return F.fold(cols, (8, 8), 3) * self.v


class UnfoldKept(nn.Module):
    """Unfold with stride = kernel size (fewer elements out than in), kept for backward: its
    storage has the input's size."""

    def __init__(self):
        super().__init__()
        self.v = nn.Parameter(torch.randn(27, 4))

    def forward(self, x):
        return F.unfold(x * 2, 3, stride=3) * self.v


@pytest.mark.parametrize("model, shape", [
    (Unfold, (4, 3, 8, 8)), (UnfoldFold, (4, 3, 8, 8)),
    (FoldKept, (4, 27, 36)), (UnfoldKept, (4, 3, 8, 8))])
def test_unfold_and_fold_are_formulas_in_b(model, shape):
    r = exact(model(), torch.randn(*shape), **ADAM)
    assert r.valid_when == (fxmem.B >= 2,)  # no upper bound, no value left out


def test_unfold_and_fold_outputs_keep_the_larger_storage():
    """Im2Col.cpp/Col2Im.cpp: output = empty_like(input), then resize_ (never shrinks)."""
    x, cols = torch.randn(4, 3, 8, 8), torch.randn(4, 27, 36)
    assert F.unfold(x, 3, stride=3).untyped_storage().nbytes() == x.nbytes  # eager itself
    assert F.fold(cols, (8, 8), 3).untyped_storage().nbytes() == cols.nbytes
    for model, inp, per_sample in ((UnfoldKept(), x, 3 * 64 * 4), (FoldKept(), cols, 27 * 36 * 4)):
        t = trace(model, inp, loss=lambda o: o.sum(), device="cpu")
        (op,) = [o for o in t.ops if o.op in ("aten.im2col.default", "aten.col2im.default")]
        assert t.storages[op.new_sids[0]].size.expr == per_sample * fxmem.B


def test_cuda_unfold_and_fold_temporaries():
    """cuda/Im2Col.cu, cuda/Col2Im.cu: empty_like(input) until a larger output replaces it,
    and a copy of a non-contiguous input."""
    x = torch.empty(4, 3, 8, 8)
    ws = lambda op, *a: dict(workspace_bytes(op, a, {}, None))
    assert ws(aten.im2col.default, x, [3, 3], [1, 1], [0, 0], [1, 1]) == {
        "empty_like(input), replaced by resize_'s larger block": x.nbytes}
    assert ws(aten.im2col.default, x, [3, 3], [1, 1], [0, 0], [3, 3]) == {}  # smaller output
    xt = x.transpose(2, 3)
    assert ws(aten.im2col.default, xt, [3, 3], [1, 1], [0, 0], [3, 3]) == {
        "input.contiguous()": x.nbytes}
    cols = torch.empty(4, 36, 27).transpose(1, 2)  # (4, 27, 36), not contiguous
    assert ws(aten.col2im.default, cols, [8, 8], [3, 3], [1, 1], [0, 0], [1, 1]) == {
        "input.contiguous()": cols.numel() * 4}
    patches = torch.empty(4, 48, 4)  # 4x4 blocks of an 8x8 image, stride 4: same size
    assert ws(aten.col2im.default, patches, [8, 8], [4, 4], [1, 1], [0, 0], [4, 4]) == {}


# --- F.pad (aten.constant_pad_nd) -----------------------------------------------------------------

class Pad(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.c(F.pad(x, (1, 1, 2, 2)))
        return F.pad(y, (-1, -1, 0, -2)) * 2  # negative: a narrowed copy


def test_pad_is_one_allocation():
    """constant_pad_nd traced as itself (one output), not as a decomposition that fills a
    second buffer."""
    exact(Pad(), torch.randn(4, 3, 8, 8), **ADAM)
    t = trace(Pad(), torch.randn(4, 3, 8, 8), loss=lambda o: o.sum(), device="cpu")
    pads = [o for o in t.ops if o.op == "aten.constant_pad_nd.default"]
    assert len(pads) == 3 and all(len(o.new_sids) == 1 for o in pads)  # two forward, one back
    assert not [o for o in t.ops if o.op == "aten.fill.Scalar"]


# --- baddbmm / addcmul on a broadcast input (Hugging Face BLOOM's alibi, timm ResMLP) ----------

class Alibi(nn.Module):
    """BLOOM's attention scores: alibi (B*H, 1, L), built from a per-head slope times the
    positions, is the baddbmm input broadcast over the query positions."""

    def __init__(self, heads=4, dim=8):
        super().__init__()
        self.heads, self.dim = heads, dim
        self.qk = nn.Linear(heads * dim, 2 * heads * dim)
        self.register_buffer("slopes", torch.rand(heads))

    def forward(self, x):
        b, n, _ = x.shape
        positions = torch.arange(n, dtype=x.dtype)[None, None, :]  # (1, 1, L)
        alibi = (self.slopes[None, :, None] * positions).expand(b, -1, -1)
        alibi = alibi.reshape(b * self.heads, 1, n)
        q, k = self.qk(x).view(b, n, 2, self.heads, self.dim).permute(2, 0, 3, 1, 4)
        q = q.reshape(b * self.heads, n, self.dim)
        k = k.reshape(b * self.heads, n, self.dim).transpose(1, 2)
        scores = alibi.baddbmm(batch1=q, batch2=k, beta=1.0, alpha=self.dim ** -0.5)
        return scores.softmax(-1)


class Affine(nn.Module):
    """timm ResMLP's Affine: addcmul(beta, alpha, x) with (1, 1, dim) parameters."""

    def __init__(self, dim):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, 1, dim))
        self.beta = nn.Parameter(torch.zeros(1, 1, dim))

    def forward(self, x):
        return torch.addcmul(self.beta, self.alpha, x)


class ResMLPBlock(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.norm1, self.norm2 = Affine(dim), Affine(dim)
        self.mix = nn.Linear(10, 10)
        self.mlp = nn.Linear(dim, dim)

    def forward(self, x):
        x = x + self.mix(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.mlp(self.norm2(x))


@pytest.mark.parametrize("model, shape", [(Alibi, (4, 12, 32)), (ResMLPBlock, (4, 10, 16))])
def test_broadcast_input_of_baddbmm_and_addcmul(model, shape):
    exact(model(), torch.randn(*shape), **ADAM)


# --- sizes read from the input --------------------------------------------------------------------

class Sizes(nn.Module):
    """torch.arange(x.shape[0]), x.new_zeros(x.shape[0]), positions expanded to the batch
    (from a fresh arange and from a registered buffer, as CLIP's position_ids), and CLIP's
    pooling: h[torch.arange(h.shape[0]), ids.argmax(-1)]."""

    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(32, 8), nn.Embedding(16, 8)
        self.l = nn.Linear(8, 8)
        self.register_buffer("position_ids", torch.arange(16).expand((1, -1)), persistent=False)

    def forward(self, ids):
        b, n = ids.shape
        fresh = torch.arange(n).expand(b, -1)
        kept = self.position_ids[:, :n].expand(b, -1)
        h = self.l(self.tok(ids) + self.pos(fresh) + self.pos(kept))
        row = torch.arange(ids.shape[0])
        pooled = h[row, ids.argmax(dim=-1)]
        return pooled + ids.new_zeros(ids.shape[0], dtype=h.dtype)[:, None] + row[:, None]


def test_sizes_read_from_the_input_stay_symbolic():
    exact(Sizes(), torch.randint(0, 32, (4, 6)), **ADAM)


# --- Hugging Face models (random weights, nothing downloaded) -------------------------------------

transformers = pytest.importorskip("transformers")
CLIP_TEXT = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, max_position_embeddings=16,
                 bos_token_id=0, pad_token_id=1, eos_token_id=2)  # 2: pooling by argmax
CLIP_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, image_size=32, patch_size=8)


class CLIP(nn.Module):
    """CLIPModel called as ``model(input_ids, pixel_values)``; its contrastive loss, labels
    from ``logits.shape[0]`` (``return_loss=True`` makes them from ``len(logits)``)."""

    def __init__(self, return_loss=False):
        super().__init__()
        cfg = transformers.CLIPConfig(text_config=CLIP_TEXT, vision_config=CLIP_VISION,
                                      projection_dim=16)
        self.model, self.return_loss = transformers.CLIPModel(cfg), return_loss

    def forward(self, ids, pixels):
        out = self.model(input_ids=ids, pixel_values=pixels, return_loss=self.return_loss)
        if self.return_loss:
            return out.loss
        logits = out.logits_per_text
        labels = torch.arange(logits.shape[0])
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


def test_bloom_alibi_baddbmm():
    cfg = transformers.BloomConfig(n_layer=2, hidden_size=64, n_head=4, vocab_size=128)
    exact(transformers.BloomForCausalLM(cfg), torch.randint(0, 128, (4, 16)),
          loss=lambda o: o.logits.float().sum(), optimizer=torch.optim.AdamW)


def test_clip_model_contrastive_loss():
    """CLIPModel: the text tower's position_ids buffer sliced and expanded, its pooling
    (eos_token_id 2: hidden[arange(B), ids.argmax(-1)]), the vision tower, and the B x B
    logits of the contrastive loss."""
    ids, pixels = torch.randint(0, 64, (4, 10)), torch.randn(4, 3, 32, 32)
    r = exact(CLIP(), (ids, pixels), loss=lambda o: o, optimizer=torch.optim.AdamW)
    assert r.peak.has(fxmem.B ** 2)  # the B x B logits (and their softmax, grads)


def test_len_of_a_batch_sized_tensor_is_fitted():
    """transformers' clip contrastive_loss: torch.arange(len(logits)). len() returns a
    Python int (CPython converts __len__'s result with __index__), so B is fixed there
    whatever the tracer does: the formula is fitted from traces at concrete batch sizes
    (fxmem.trace.engine.lift), exact at one none of them used, and the report names the line."""
    ids, pixels = torch.randint(0, 64, (4, 10)), torch.randn(4, 3, 32, 32)
    r = exact(CLIP(return_loss=True), (ids, pixels), bs=(7,), loss=lambda o: o,
              optimizer=torch.optim.AdamW)
    assert "contrastive_loss" in r.lifted and r.peak.has(fxmem.B ** 2)


# --- what the Python dispatcher must leave alone --------------------------------------------------

class Cells(nn.Module):
    def __init__(self, bias):
        super().__init__()
        self.lstm, self.gru = nn.LSTMCell(8, 16, bias=bias), nn.GRUCell(16, 16, bias=bias)

    def forward(self, x):
        return self.gru(self.lstm(x)[0])


@pytest.mark.parametrize("bias", [True, False])
def test_cuda_fused_cells_keep_fxmem_meta_kernels(bias):
    """fxmem.trace.kernels.cuda.rnn.META replaces PyTorch's meta kernels of the fused RNN cells (its
    LSTM cell's fails on bias=False); the Python dispatcher would prefer PyTorch's."""
    r = fxmem.analyze(Cells(bias), torch.randn(4, 8), **ADAM, device="cuda")
    assert r.peak.has(fxmem.B)


def test_cuda_padded_mask_with_symbolic_length():
    """CUDA's memory-efficient attention pads a mask's last dim to 8 (attention.cpp
    pad_bias): constant_pad_nd with a symbolic pad, and guards with torch's Mod."""

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(16, 48)

        def forward(self, x, mask):
            b, n, _ = x.shape
            q, k, v = self.qkv(x).view(b, n, 3, 2, 8).permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    x, mask = torch.randn(4, 13, 16), torch.randn(4, 1, 13, 13)
    r = fxmem.analyze(Attention(), (x, mask), loss=lambda o: o.sum(), device="cuda",
                      dims={"L": [(0, 1), (1, 2), (1, 3)]})
    assert r.trace.kernel_choices[0][1].endswith("mask)")
    assert r.peak.free_symbols == {fxmem.B, L}
    assert not [o for o in r.trace.ops if o.op == "aten.fill.Scalar"]  # pad: one allocation
