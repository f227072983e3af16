"""fxmem.trace.kernels.cuda.workspaces: CUDA kernel temporaries, re-derived by hand from PyTorch
2.13's sources.

Each expected value is written out from the kernel's formula in the comment beside it (file and
function named in fxmem/trace/kernels/cuda/workspaces.py). CUB's radix-sort storage is checked
against the sizes CCCL 3.0.1's own host code returns (DeviceRadixSort::SortPairs / DispatchRadixSort
with d_temp_storage = nullptr, compiled with nvcc 13.0 and run without a GPU).
"""

import importlib
import math

import pytest
import sympy
import torch
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

import fxmem
from fxmem.trace.kernels.compat import TORCH
from fxmem.trace.kernels.cuda import workspaces as cw

aten = torch.ops.aten
FAKE = FakeTensorMode(allow_non_fake_inputs=True)
F32, BF16, I64, I32 = torch.float32, torch.bfloat16, torch.int64, torch.int32


@pytest.fixture(autouse=True)
def _flags_restored():
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def fake(*shape, dtype=F32):
    with FAKE:
        return torch.empty(*shape, dtype=dtype)


def ws(op, *args, **kw):
    return dict(cw.workspace_bytes(op, args, {}, None, **kw))


class Sym:
    """A ShapeEnv with the batch symbol B, as fxmem.trace makes it."""

    def __init__(self, hint=8):
        self.env = ShapeEnv(specialize_zero_one=False, duck_shape=False)
        self.mode = FakeTensorMode(shape_env=self.env, allow_non_fake_inputs=True)
        self.sym = self.env.create_symbol(hint, source=ConstantSource("B"),
                                          dynamic_dim=DimDynamic.DYNAMIC)
        self.env.constrain_symbol_range(self.sym, compiler_min=1, compiler_max=2**62)
        self.B = self.env.create_symintnode(self.sym, hint=hint)

    def at(self, x, b):
        if isinstance(x, int):
            return x
        return int(sympy.sympify(x.node.expr).xreplace({self.sym: sympy.Integer(b)}))

    def total(self, entries, b):
        return sum(self.at(n, b) for _, n in entries)

    def untouched(self):
        """No guard, no replacement: B was never specialized."""
        return not self.env.guards and not self.env.replacements


# --- CUB radix sort: CCCL 3.0.1's host code ---------------------------------------------------

# (capability, n, key bytes, bits, temp_storage_bytes as returned by CCCL 3.0.1)
CCCL = [((9, 0), 0, 8, 64, 1), ((9, 0), 2304, 8, 64, 1), ((9, 0), 2305, 8, 64, 55295),
        ((9, 0), 8192, 8, 64, 150015), ((9, 0), 1000000, 8, 64, 16240127),
        ((9, 0), 300000000, 8, 64, 4859685375), ((9, 0), 8192, 8, 20, 139775),
        ((9, 0), 100000, 8, 8, 25087), ((9, 0), 4864, 4, 32, 1), ((9, 0), 4865, 4, 32, 49151),
        ((9, 0), 1000000, 4, 32, 8166399), ((10, 0), 8192, 8, 64, 150015),
        ((12, 0), 1000000, 8, 64, 16240127), ((8, 0), 8192, 8, 64, 151039),
        ((8, 0), 1000000, 8, 64, 16284159), ((8, 6), 3072, 8, 64, 67071),
        ((8, 0), 8192, 4, 32, 76287), ((7, 5), 8192, 8, 64, 151039),
        ((7, 5), 1000000, 4, 32, 8095743), ((7, 5), 300000000, 8, 8, 97617407)]


@pytest.mark.parametrize("cap,n,key,bits,expected", CCCL)
def test_radix_sort_temp_bytes_matches_cccl(cap, n, key, bits, expected):
    assert cw.radix_sort_temp_bytes(n, key, math.ceil(bits / 8), cap) == expected


def onesweep(n, key, passes, tile):
    """dispatch_radix_sort.cuh InvokeOnesweep for n < 2**28 (one portion), by hand."""
    r = lambda x: -(-x // 256) * 256
    return r(passes * 256 * 8) + r(-(-n // tile) * 1024) + 2 * r(n * key) * (passes > 1) + \
        r(passes * 4) + 255


# --- 1. embedding_dense_backward ---------------------------------------------------------------

def emb(n, V, D, dtype=F32, idx=I64, scale=False, **kw):
    return ws(aten.embedding_dense_backward.default, fake(n, D, dtype=dtype),
              fake(n, dtype=idx), V, -1, scale, **kw)


def test_embedding_gpt2_two_pass():
    n, V, D = 16 * 512, 50257, 768  # GPT-2 wte, B=16, L=512, fp32, int64 indices
    m, P = min(n, V), n // 10 + min(n, V)
    # sum_scatter_grid = ceil(m * 768 / 768) = 8192 >= 4 * 132: the two-pass path; it peaks in
    # the segments phase (P*D*4 = 27.7 MB >> the sort's range + CUB storage)
    assert emb(n, V, D) == {
        "sorted_indices": 8 * n, "orig_indices": 8 * n, "segment_offsets": 8 * n,
        "num_of_segments": 8, "partials_per_segment": 8 * m, "partials_per_segment_offset": 8 * m,
        "num_of_partial_segments": 8, "partial_segment_offset": 8 * P,
        "grad_weight_per_segment (two-pass path)": P * D * 4}


def test_embedding_path_a_below_3073_indices():
    assert emb(3072, 50257, 768) == {}
    assert "sorted_indices" in emb(3073, 50257, 768)
    args = (fake(3072, 768), fake(3072, dtype=I64), 50257, -1, False)
    assert cw.unmodelled(aten.embedding_dense_backward.default, args, {}, None) is None


def test_embedding_scale_grad_by_freq_small_n():
    n, V, D = 100, 1000, 16  # scale_grad_by_freq: path B even for n = 100
    m, P = 100, 100 // 10 + 100
    # phases (sorted+orig = 16n common): sort 8n + CUB 1 (one tile); unique_by_key count 8n +
    # segment_offsets 8n + 8 + keys_out 8n; segments: count, segment_offsets, 8, 2*8m, 8, 8P,
    # grid = 100 < 528 but P = 110 <= 4*100: two-pass P*D*4 = 7040 -> segments is the largest
    got = emb(n, V, D, scale=True)
    assert got == {"sorted_indices": 8 * n, "orig_indices": 8 * n,
                   "count (scale_grad_by_freq)": 8 * n, "segment_offsets": 8 * n,
                   "num_of_segments": 8, "partials_per_segment": 8 * m,
                   "partials_per_segment_offset": 8 * m, "num_of_partial_segments": 8,
                   "partial_segment_offset": 8 * P,
                   "grad_weight_per_segment (two-pass path)": P * D * 4}
    text = cw.unmodelled(aten.embedding_dense_backward.default,
                         (fake(n, D), fake(n, dtype=I64), V, -1, True), {}, None)
    assert "inclusive_scan_by_key" in text and "unique_by_key" in text


def test_embedding_fused_atomic_path_bf16():
    n, V, D = 8192, 100, 1024
    m, P = 100, 8192 // 10 + 100
    # grid = ceil(100 * 1024 / 1024) = 100 < 4 * 132 and P = 919 > 400: fused; bf16 adds the fp32
    # grad_weight_acc V*D*4; segments (about 623 KB) > sort (16n + 8n + 150015)
    fused = {"sorted_indices": 8 * n, "orig_indices": 8 * n, "segment_offsets": 8 * n,
             "num_of_segments": 8, "partials_per_segment": 8 * m,
             "partials_per_segment_offset": 8 * m, "num_of_partial_segments": 8,
             "partial_segment_offset": 8 * P, "partial_to_segment_idx (fused atomic path)": 8 * P,
             "grad_weight_acc fp32 (fused atomic path)": V * D * 4}
    assert emb(n, V, D, BF16) == fused
    # with 20 SMs, 100 >= 4 * 20: the two-pass path
    two_pass = {k: v for k, v in fused.items() if "fused" not in k}
    two_pass["grad_weight_per_segment (two-pass path)"] = P * D * 4
    assert emb(n, V, D, BF16, num_sms=20) == two_pass
    torch.use_deterministic_algorithms(True)  # atomics are skipped in deterministic mode
    assert emb(n, V, D, BF16) == two_pass


def test_embedding_token_types_peak_in_sort():
    n, V, D = 8192, 2, 768  # BERT token types, fp32: fused, no fp32 copy
    # sort: 16n + 8n + CUB(8192, int64 on sm90) = 131072 + 65536 + 150015; segments: 16n + 8n + 8
    # + 32 + 8 + 2 * 8P (P = 821) = 209,840 -> the sort phase peaks
    assert emb(n, V, D) == {"sorted_indices": 8 * n, "orig_indices": 8 * n,
                            "range = arange(n), until the sort ends": 8 * n,
                            "CUB radix-sort temp storage": onesweep(n, 8, 8, 384 * 12)}


def test_embedding_int32_indices_and_noncontiguous_grad():
    n, V, D = 4000, 50257, 8
    with FAKE:
        g = torch.empty(D, n).t()  # a transposed grad: grad_.contiguous() copies it
    got = ws(aten.embedding_dense_backward.default, g, fake(n, dtype=I32), V, -1, False)
    # s = 4; the sort fits one int32 tile (4000 <= 4864): CUB storage 1 B. Phases beyond the
    # common 8n: sort 4n + 1; unique 4n + 8 + 4n; segments 4n + 8 + 8m + 8 + 4P + 4P*D*... :
    # P = 400 + 4000, two-pass P*8*4 = 140800 -> segments
    m, P = 4000, 4400
    assert got == {"grad.contiguous()": n * D * 4, "sorted_indices": 4 * n,
                   "orig_indices": 4 * n, "segment_offsets": 4 * n, "num_of_segments": 8,
                   "partials_per_segment": 4 * m, "partials_per_segment_offset": 4 * m,
                   "num_of_partial_segments": 8, "partial_segment_offset": 4 * P,
                   "grad_weight_per_segment (two-pass path)": P * D * 4}


def test_embedding_symbolic_batch():
    s, L, V, D = Sym(), 512, 50257, 768
    with s.mode:
        g, i = torch.empty(s.B, L, D), torch.zeros(s.B, L, dtype=I64)
        got = cw.workspace_bytes(aten.embedding_dense_backward.default,
                                 (g, i, V, -1, False), {}, None)
        torch.empty(sum(n for _, n in got), dtype=torch.uint8)  # as fxmem records it
    for b in (1, 6, 7, 8, 97, 98, 99, 300):
        n = b * L
        m, P = min(n, V), n // 10 + min(n, V)
        hand = 0 if n <= 3072 else 3 * 8 * n + 8 + 2 * 8 * m + 8 + 8 * P + P * D * 4
        assert s.total(got, b) == hand, b
    assert s.untouched()


def test_embedding_symbolic_peak_phase_moves():
    s, L, V, D = Sym(), 512, 2, 64  # token types: fused for every B; the peak phase depends on B
    with s.mode:
        got = cw.workspace_bytes(aten.embedding_dense_backward.default,
                                 (torch.empty(s.B, L, D), torch.zeros(s.B, L, dtype=I64), V, -1,
                                  False), {}, None)
    for b in (6, 7, 8, 64, 1000):
        n = b * L
        m, P = min(n, V), n // 10 + min(n, V)
        phases = [8 * n + onesweep(n, 8, 8, 4608),  # range + CUB storage
                  8 * n + 8 + 8 * n,  # segment_offsets, num_of_segments, keys_out
                  8 * n + 8 + 16 * m + 8 + 8 * P + 8 * P]  # ... + partial_to_segment_idx
        assert s.total(got, b) == (0 if n <= 3072 else 16 * n + max(phases)), b
    assert s.untouched()



def bag(n, V, D, bags=32, mode=0, scale=False, dtype=F32):
    """_embedding_bag_dense_backward(grad {bags, D}, indices {n}, offset2bag {n},
    bag_size {bags}, max_indices, V, scale, mode, per_sample_weights, padding_idx)."""
    idx = fake(n, dtype=I64)
    return ws(aten._embedding_bag_dense_backward.default, fake(bags, D, dtype=dtype), idx, idx,
              fake(bags, dtype=I64), fake(bags, D, dtype=I64) if mode == 2 else fake(0, dtype=I64),
              V, scale, mode, None, -1)


def test_embedding_bag_always_sorts():
    """EmbeddingBag.cu embedding_bag_backward_cuda_sum_avg: radix_sort_pairs whatever n (no
    3,072 threshold), then embedding_backward_cuda_kernel with offset2bag."""
    n, V, D = 100, 1000, 16
    m, P = 100, 100 // 10 + 100
    # as the dense kernel with scale_grad_by_freq, minus count: segments peaks (P*D*4 = 7040)
    expected = {"sorted_indices": 8 * n, "orig_indices": 8 * n, "segment_offsets": 8 * n,
                "num_of_segments": 8, "partials_per_segment": 8 * m,
                "partials_per_segment_offset": 8 * m, "num_of_partial_segments": 8,
                "partial_segment_offset": 8 * P,
                "grad_weight_per_segment (two-pass path)": P * D * 4}
    assert bag(n, V, D) == bag(n, V, D, mode=1) == expected
    assert emb(n, V, D) == {}  # the dense kernel's path A
    assert bag(0, V, D) == {}  # all bags empty: zeros, no sort
    assert bag(n, V, D, mode=2) == {}  # max: embedding_bag_backward_cuda_max, atomics
    args = lambda mode: (fake(32, D), fake(n, dtype=I64), fake(n, dtype=I64),
                         fake(32, dtype=I64), fake(0, dtype=I64), V, False, mode, None, -1)
    assert "unique_by_key" in cw.unmodelled(aten._embedding_bag_dense_backward.default,
                                            args(0), {}, None)
    assert cw.unmodelled(aten._embedding_bag_dense_backward.default, args(2), {}, None) is None


def test_embedding_bag_never_takes_the_fused_path():
    """embedding_backward_cuda_kernel: use_fused_kernel needs !offset2bag.defined()."""
    n, V, D = 8192, 100, 1024  # the dense kernel fuses here (test_embedding_fused_atomic_path)
    dense = emb(n, V, D, BF16)
    assert "partial_to_segment_idx (fused atomic path)" in dense
    got = bag(n, V, D, dtype=BF16)
    assert got == {**{k: v for k, v in dense.items() if "fused" not in k},
                   "grad_weight_per_segment (two-pass path)": (n // 10 + V) * D * 4}
    with FAKE:
        g = torch.empty(D, 32, dtype=BF16).t()  # grad.contiguous() copies {bags, D}
    idx = fake(n, dtype=I64)
    assert ws(aten._embedding_bag_dense_backward.default, g, idx, idx, fake(32, dtype=I64),
              fake(0, dtype=I64), V, False, 0, None, -1) == {
        "grad.contiguous()": 32 * D * 2, **got}

# --- 2. index_put (accumulate) and deterministic index_add_ ---------------------------------------

def test_index_put_embedding_style():
    W, idx, v = fake(1000, 64), fake(4, 16, dtype=I64), fake(4, 16, 64)
    # K = 64 <= 2304: CUB storage 1 B; linearIndex, sorted, orig, range: 4 * 8K; value already
    # (4, 16, 64) = vals_shape and contiguous: no copy; makeLinearIndex (2 * 8K) is smaller
    for op in (aten.index_put.default, aten.index_put_.default):
        assert ws(op, W, [idx], v, True) == {
            "linearIndex": 8 * 64, "sorted_indices": 8 * 64, "orig_indices": 8 * 64,
            "range": 8 * 64,
            "CUB radix-sort temp storage": 1}
    assert ws(aten._index_put_impl_.default, W, [idx], v, True, True) == ws(
        aten.index_put.default, W, [idx], v, True)
    assert ws(aten.index_put.default, W, [idx], v, False) == {}  # no accumulate: no sort


def test_index_put_large_two_pass_sort():
    K, V, D = 8192, 50257, 768
    got = ws(aten.index_put.default, fake(V, D), [fake(16, 512, dtype=I64)], fake(16, 512, D),
             True)
    # nbits = bit length of (V*D - 1) // D = 50256: 16 -> 2 passes; sm90 int64 tile 4608
    assert got == {"linearIndex": 8 * K, "sorted_indices": 8 * K, "orig_indices": 8 * K,
                   "range": 8 * K,
                   "CUB radix-sort temp storage": onesweep(K, 8, 2, 4608)}


def test_index_put_nonadjacent_int32_and_broadcast_value():
    x, i1, i2 = fake(4, 10, 5), fake(7, dtype=I64), fake(7, dtype=I32)
    got = ws(aten.index_put.default, x, [i1, None, i2], fake(7, 10), True)
    # non-adjacent: src = x.permute(0, 2, 1) is not contiguous: a 4*10*5*4 copy; vals_shape
    # (7, 10); makeLinearIndex (int32 copy 8*7 + 3*8*7) <= the sort's 4*8*7 + 1
    assert got == {"transposed self .contiguous() (src_)": 800,
                   "linearIndex": 8 * 7, "sorted_indices": 8 * 7, "orig_indices": 8 * 7,
                   "range": 8 * 7,
                   "CUB radix-sort temp storage": 1}
    got = ws(aten.index_put.default, fake(10, 64), [fake(6, dtype=I64)], fake(1, 64), True)
    assert got["value.expand(vals_shape).contiguous()"] == 6 * 64 * 4  # broadcast value
    torch.use_deterministic_algorithms(True)  # deterministic: the sort path without accumulate
    assert ws(aten.index_put.default, fake(10, 64), [fake(6, dtype=I64)], fake(6, 64), False)


def test_index_put_and_index_with_a_mask():
    s = Sym()
    with s.mode:
        x, mask, v = torch.empty(s.B, 12, 4), torch.empty(s.B, 12, dtype=torch.bool), \
            torch.empty(4)
        count = mask.nonzero().shape[0].node.expr  # unbacked, memoized on the mask

        def at(n, b, c):  # bytes with B = b and c True values
            e = sympy.sympify(n if isinstance(n, int) else n.node.expr)
            return int(e.xreplace({s.sym: sympy.Integer(b), count: sympy.Integer(c)}))

        # make_info's expandTensors: nonzero() of the (B, 12) mask, {2, n} int64, held while
        # index_put_stub / index_stub run (TensorAdvancedIndexing.cpp _index_put_impl_, index)
        for op, args in ((aten.index_put_.default, (x, [mask], v, False)),
                         (aten.index.Tensor, (x, [mask]))):
            (what, nbytes), = cw.workspace_bytes(op, args, {}, None)
            assert what.startswith("nonzero(mask)") and at(nbytes, 8, 7) == 2 * 8 * 7
            assert "nonzero" in cw.unmodelled(op, args, {}, None)  # CUB's small storage
        # x[mask] = 0.0: a one-element CPU value, canDispatchToMaskedFill: masked_fill_
        zero = (x, [mask], torch.empty(()), False)
        assert cw.workspace_bytes(aten.index_put_.default, zero, {}, None) == []
        assert cw.unmodelled(aten.index_put_.default, zero, {}, None) is None
        # accumulate: index_put_with_sort_kernel on the expanded indices, K = n; phase
        # makeLinearIndex: nonzero (2*8n), linearIndex, remainder(), * stride (3*8n); phase
        # sort: value.expand((n, 4)).contiguous() (16n), linearIndex, sorted, orig, range
        # (4*8n), CUB's storage (largestIndex / sliceSize = 12B - 1: one 8-bit pass at B=8)
        got = cw.workspace_bytes(aten.index_put_.default, (x, [mask], v, True), {}, None)
    for c in (1, 7, 96):
        cub = cw.radix_sort_temp_bytes(c, 8, 1, (9, 0))
        assert sum(at(n, 8, c) for _, n in got) == max(5 * 8 * c, 16 * c + 32 * c + cub), c


def test_mask_count_bounded_by_the_mask_in_a_cuda_trace():
    """End to end: the count is taken at its largest, the mask's B*T elements."""
    from test_datadep import MaskedAssign, _sum

    r = fxmem.analyze(MaskedAssign(), torch.randn(4, 12, 8), loss=_sum, device="cuda")
    got = {(r.trace.ops[st.created_by].op, st.name): st.size.expr
           for st in r.trace.storages if st.data_bound}
    B = fxmem.B
    nonzero = "nonzero(mask): 2 int64 columns of the True values"
    assert got[("aten.index_put_.default", nonzero)] == 2 * 8 * 12 * B
    assert got[("aten.index.Tensor", "")] == 12 * B * 8 * 4  # grad[mask] in backward


def test_index_put_symbolic_gather_backward():
    s = Sym()
    with s.mode:  # logits[torch.arange(B), pos] backward: zeros(B, 128, 10).index_put(.., True)
        x, a0, p = torch.zeros(s.B, 128, 10), torch.arange(s.B), torch.zeros(s.B, dtype=I64)
        got = cw.workspace_bytes(aten.index_put.default, (x, [a0, p], torch.empty(s.B, 10), True),
                                 {}, None)
    for b in (1, 8, 2304, 2305, 5000):
        big = (b * 128 * 10 - 1) // 10  # largestIndex / sliceSize
        passes = -(-big.bit_length() // 8)
        cub = 1 if b <= 2304 else onesweep(b, 8, passes, 4608)
        assert s.total(got, b) == 4 * 8 * b + cub, b
    assert s.untouched()


def test_index_add_only_when_deterministic():
    args = (fake(10, 4), 0, fake(6, dtype=I32), fake(6, 4))
    assert ws(aten.index_add_.default, *args) == {}
    torch.use_deterministic_algorithms(True)
    # source * alpha (6*4*4), index.to(kLong) (6*8), then index_put_: K = 6, sliceSize 4,
    # nbits = bit length of 39 // 4 = 9: one pass, one tile -> 1 B
    want = {"source * alpha": 96, "index.to(kLong)": 48,
            "linearIndex": 8 * 6, "sorted_indices": 8 * 6, "orig_indices": 8 * 6,
            "range": 8 * 6,
            "CUB radix-sort temp storage": 1}
    assert ws(aten.index_add_.default, *args) == want
    assert ws(aten.index_add.default, *args) == want
    with FAKE:
        t = torch.empty(4, 10).t()  # a transposed self: index_put_ copies it (in place only)
    assert ws(aten.index_add_.default, t, *args[1:]) == {**want, "self.contiguous()": 160}
    assert ws(aten.index_add.default, t, *args[1:]) == want  # writes a new contiguous result


# --- 3. GroupNorm ------------------------------------------------------------------------------

def test_group_norm_forward_and_backward():
    N, C, HxW, G = 8, 64, 256, 32
    x, w, st = fake(N, C, 16, 16, dtype=BF16), fake(C, dtype=BF16), fake(N, G, dtype=BF16)
    acc = 4  # fp32 for bf16
    assert ws(aten.native_group_norm.default, x, w, w, N, C, HxW, G, 1e-5) == {
        "a = empty({N, C}, acc)": N * C * acc, "b = empty({N, C}, acc)": N * C * acc}
    assert ws(aten.native_group_norm.default, x, None, None, N, C, HxW, G, 1e-5) == {}
    assert ws(aten.native_group_norm_backward.default, x, x, st, st, w, N, C, HxW, G,
              [True, True, True]) == {
        "ds = empty({N, C}, acc)": N * C * acc, "db = empty({N, C}, acc)": N * C * acc,
        "c1 = rstd * gamma, {N, G, D} acc": N * C * acc,
        "c2 = empty({N, G}, acc)": N * G * acc, "c3 = empty({N, G}, acc)": N * G * acc}
    x1 = fake(N, C, dtype=BF16)  # HxW == 1: GroupNorm1dForward/Backward
    assert ws(aten.native_group_norm.default, x1, w, w, N, C, 1, G, 1e-5) == {}
    assert set(ws(aten.native_group_norm_backward.default, x1, x1, st, st, w, N, C, 1, G,
                  [True, True, True])) == {"ds = empty({N, C}, acc)", "db = empty({N, C}, acc)",
                                           "c2 = empty({N, G}, acc)", "c3 = empty({N, G}, acc)"}


def test_group_norm_copies_a_channels_last_input_and_grad():
    """group_norm.cpp native_group_norm(_backward): memory_format is Contiguous off the CPU, so
    X.contiguous() and dY.contiguous() copy a channels_last X and dY until the op returns."""
    N, C, HxW, G = 8, 64, 256, 32
    with FAKE:
        x = torch.empty(N, C, 16, 16).to(memory_format=torch.channels_last)
    w, st = fake(C), fake(N, G)
    fwd = ws(aten.native_group_norm.default, x, w, w, N, C, HxW, G, 1e-5)
    bwd = ws(aten.native_group_norm_backward.default, x, x, st, st, w, N, C, HxW, G,
             [True, True, True])
    stats = {"a = empty({N, C}, acc)": N * C * 4, "b = empty({N, C}, acc)": N * C * 4}
    # 2.15: its channels-last kernels: nothing of X copied (fxmem.trace.kernels.cuda.norms)
    if TORCH >= (2, 15):
        assert fwd == stats
        assert bwd == {"ds = empty({N, C}, acc)": N * C * 4, "db = empty({N, C}, acc)": N * C * 4,
                       "c2 = empty({N, G}, acc)": N * G * 4, "c3 = empty({N, G}, acc)": N * G * 4}
        return
    assert fwd == {"input.contiguous()": N * C * HxW * 4, **stats}
    assert bwd["grad_out.contiguous()"] == bwd["input.contiguous()"] == N * C * HxW * 4


def test_group_norm_symbolic():
    s, C, G = Sym(), 64, 32
    with s.mode:
        x, w, st = torch.empty(s.B, C, 8, 8), torch.empty(C), torch.empty(s.B, G)
        fwd = cw.workspace_bytes(aten.native_group_norm.default,
                                 (x, w, w, s.B, C, 64, G, 1e-5), {}, None)
        bwd = cw.workspace_bytes(aten.native_group_norm_backward.default,
                                 (x, x, st, st, w, s.B, C, 64, G, [True, True, True]), {}, None)
    for b in (1, 3, 40):
        assert s.total(fwd, b) == 2 * b * C * 4
        assert s.total(bwd, b) == 3 * b * C * 4 + 2 * b * G * 4
    assert s.untouched()


# --- 4. LayerNorm / RMSNorm backward -------------------------------------------------------------

def ln(M, N, cap=(9, 0), dy=None, **kw):
    x, w = fake(M, N), fake(N)
    return ws(aten.native_layer_norm_backward.default, x if dy is None else dy, x, [N],
              fake(M, 1), fake(M, 1), w, w, [True, True, True], capability=cap, **kw)


def test_layer_norm_large_m_partials():
    M, N = 70000, 768  # M > 65536, N / 32 = 24 < 132 / 2
    by = min(32768 // -(-N // 32), -(-M // 32))  # min(1365, 2188)
    assert ln(M, N) == {"dgamma_blocks": by * N * 4, "dbeta_blocks": by * N * 4,
                        "preallocated dgamma/dbeta, replaced by the blocks' sum(0)": N * 4}
    assert ln(65536, N) == {}  # M not > 65536
    assert ln(M, 4096) == {}  # 4096 / 32 = 128 >= 66
    assert ln(M, 1696, cap=(8, 0)) != {}  # A100, 108 SMs: 53 < 54
    assert ln(M, 1728, cap=(8, 0)) == {}  # 54 < 54 fails
    assert ln(M, 1728, cap=(8, 0), num_sms=132) != {}


def test_layer_norm_noncontiguous_dy_and_rms():
    M, N = 1000, 512
    with FAKE:
        dy = torch.empty(N, M).t()
    assert ln(M, N, dy=dy) == {"dY.contiguous()": M * N * 4}
    M = 70000
    by = min(32768 // (N // 32), -(-M // 32))
    got = ws(aten._fused_rms_norm_backward.default, fake(M, N), fake(M, N), [N], fake(M, 1),
             fake(N), [True, True])
    assert got == {"dgamma_blocks": by * N * 4,
                   "preallocated dgamma/dbeta, replaced by the blocks' sum(0)": N * 4}
    args = (fake(M, N), fake(M, N), [N], fake(M, 1), fake(N), [True, True])
    assert "Reduce.cuh" in cw.unmodelled(aten._fused_rms_norm_backward.default, args, {}, None)
    args = (fake(100, N), fake(100, N), [N], fake(100, 1), fake(N), [True, True])
    assert cw.unmodelled(aten._fused_rms_norm_backward.default, args, {}, None) is None


def test_layer_norm_symbolic_m():
    s, L, N = Sym(), 128, 768
    with s.mode:
        x, w, st = torch.empty(s.B, L, N), torch.empty(N), torch.empty(s.B, L, 1)
        got = cw.workspace_bytes(aten.native_layer_norm_backward.default,
                                 (x, x, [N], st, st, w, w, [True, True, True]), {}, None)
    for b in (1, 512, 513, 10000):
        M = b * L
        by = min(32768 // (N // 32), -(-M // 32))
        assert s.total(got, b) == (0 if M <= 65536 else 2 * by * N * 4 + N * 4), b
    assert s.untouched()


def test_ops_table_and_others():
    assert aten.embedding_dense_backward.default in cw.OPS
    assert aten._embedding_bag_dense_backward.default in cw.OPS
    assert aten._index_put_impl_.default in cw.OPS and aten.index_add_.default in cw.OPS
    assert cw.workspace_bytes(aten.mm.default, (fake(2, 2), fake(2, 2)), {}, None) == []
    assert cw.unmodelled(aten.mm.default, (fake(2, 2), fake(2, 2)), {}, None) is None


def test_embedding_bag_backward_promotes_int32_indices_first():
    """EmbeddingBag.cpp _embedding_bag_backward_symint: int32 indices with int64 offsets are
    converted to int64 (promoteIndicesAndOffsets), then sorted as int64 indices are."""
    n, V, D = 100, 1000, 16
    args = lambda idx: (fake(32, D), fake(n, dtype=idx), fake(33, dtype=I64), fake(n, dtype=I64),
                        fake(32, dtype=I64), fake(0, dtype=I64), V, False, 0, False, None, -1)
    same = ws(aten._embedding_bag_backward.default, *args(I64))
    mixed = ws(aten._embedding_bag_backward.default, *args(I32))
    assert mixed == {"indices.to(offsets' dtype) (promoteIndicesAndOffsets)": n * 8, **same}
    assert same == bag(n, V, D)


# --- 6. softmax, log_softmax (cuda/SoftMax.cu) ---------------------------------------------------

F16 = torch.float16


def test_softmax_backward_keeps_the_product_of_grad_and_output():
    """softmax_backward_cuda_out: Tensor tmp = grad * output (grad's size, the two's result
    dtype) until host_softmax_backward returns; log_softmax's backward has no product."""
    g, y = fake(8, 12, 64), fake(8, 12, 64)
    assert ws(aten._softmax_backward_data.default, g, y, -1, F32) == {
        "tmp = grad_output * output": 8 * 12 * 64 * 4}
    h = fake(8, 12, 64, dtype=F16)
    assert ws(aten._softmax_backward_data.default, h, h, -1, F16) == {
        "tmp = grad_output * output": 8 * 12 * 64 * 2}
    # the half_to_float backward: float32 gradient and output, a float16 input
    assert ws(aten._softmax_backward_data.default, g, y, -1, F16) == {
        "tmp = grad_output * output": 8 * 12 * 64 * 4}
    assert ws(aten._log_softmax_backward_data.default, g, y, -1, F32) == {}
    assert ws(aten._softmax.default, g, 1, False) == {}
    assert ws(aten._softmax_backward_data.default, fake(0, 5), fake(0, 5), 1, F32) == {}


def test_softmax_copies_what_is_not_contiguous():
    """host_softmax: input.contiguous(); host_softmax_backward: grad.contiguous() (of the
    product, laid out as grad_output) and output.contiguous()."""
    with FAKE:
        t = torch.empty(64, 8, 12).transpose(0, 2)  # (12, 8, 64), not contiguous
    n = t.numel() * 4
    assert ws(aten._softmax.default, t, 1, False) == {"self.contiguous()": n}
    assert ws(aten._log_softmax.default, t, 1, False) == {"self.contiguous()": n}
    c = fake(12, 8, 64)
    assert ws(aten._softmax_backward_data.default, t, c, 1, F32) == {
        "tmp = grad_output * output": n, "tmp.contiguous()": n}
    assert ws(aten._softmax_backward_data.default, c, t, 1, F32) == {
        "tmp = grad_output * output": n, "output.contiguous()": n}
    assert ws(aten._log_softmax_backward_data.default, t, t, 1, F32) == {
        "grad_output.contiguous()": n, "output.contiguous()": n}
    with FAKE:  # the gradient of a sum: an expanded scalar, laid out as the output
        ones = torch.ones(()).expand(12, 8, 64)
    assert ws(aten._softmax_backward_data.default, ones, c, 1, F32) == {
        "tmp = grad_output * output": n}
    assert ws(aten._softmax_backward_data.default, ones, t, 1, F32) == {
        "tmp = grad_output * output": n, "tmp.contiguous()": n, "output.contiguous()": n}


def test_softmax_backward_symbolic():
    s, H, L = Sym(), 4, 32
    with s.mode:
        p = torch.empty(s.B, H, L, L)
        ones = torch.empty(()).as_strided((s.B, H, L, L), (0, 0, 0, 0))  # a sum's gradient
        got = cw.workspace_bytes(aten._softmax_backward_data.default, (p, p, -1, F32), {}, None)
        summed = cw.workspace_bytes(aten._softmax_backward_data.default, (ones, p, -1, F32),
                                    {}, None)
        last = cw.workspace_bytes(aten._softmax.default, (p.transpose(0, 3), 0, False), {}, None)
    for b in (1, 3, 40):
        assert s.total(got, b) == s.total(summed, b) == b * H * L * L * 4
        assert s.total(last, b) == b * H * L * L * 4  # the transposed input copied
    assert s.untouched()


def test_softmax_product_in_a_cuda_trace():
    """device="cuda": the product is a storage the backward op makes and frees, B·16 float32
    values here; device="cpu" has none."""
    from fxmem.formula.symbols import B
    from fxmem.trace import trace

    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Softmax(-1))
    x = torch.randn(4, 8)

    def made(t):  # the kernel's temporaries (the op's output aside)
        (op,) = [o for o in t.ops if o.op == "aten._softmax_backward_data.default"]
        return [str(t.storages[s].size.expr) for s in op.new_sids if t.storages[s].name]

    assert made(trace(m, x, loss=lambda o: o.sum(), device="cuda")) == [str(64 * B)]
    assert made(trace(m, x, loss=lambda o: o.sum(), device="cpu")) == []


# --- 8. _chunk_cat.out (cuda/TensorShape.cu; FSDP2's reduce-scatter copy-in) ---------------

def test_chunk_cat_packs_its_metadata_on_the_device():
    """_chunk_cat_out_cuda's fast path: seven int64 vectors packed and moved to the device,
    (6 * inputs + 2 + blocks) * 8 bytes, a block per 2,048 bytes of each input's padded chunk.
    Seen on the fake GPU (tests/test_fake_gpu_parallel.py, two ranks): 4,320 B for a block's
    gradients (1024x256, 1024, 256x1024, 256), 144 B for the head's (10x256, 10)."""
    op = torch.ops.aten._chunk_cat.out
    pack = "pack_vecs: addresses, sizes, block map"

    def cat(shapes, dst=F32, src=F32, chunks=2):
        grads = [fake(*s, dtype=src) for s in shapes]
        out = fake(sum(math.prod(s) for s in shapes) + 64, dtype=dst)
        return dict(cw.workspace_bytes(op, (grads, 0, chunks), {"out": out}, None))

    block = [(1024, 256), (1024,), (256, 1024), (256,)]
    assert cat(block) == {pack: 4320}
    assert cat([(10, 256), (10,)]) == {pack: 144}
    # rows padded to a multiple of the chunks, bfloat16 into float32 chunks of float32 bytes
    # (3 rows over 4 chunks: chunks of one row)
    assert cat([(3, 1000)], chunks=4) == {pack: (6 + 2 + math.ceil(1000 * 4 / 2048)) * 8}
    assert cat([(3, 1000)], dst=F32, src=BF16, chunks=4) == cat([(3, 1000)], chunks=4)
    # another mix of dtypes, or an input that is not contiguous: the composite, not sized
    assert cat(block, dst=BF16) == {}
    with FAKE:
        t = torch.empty(256, 64).t()
    assert dict(cw.workspace_bytes(op, ([t], 0, 2), {"out": fake(64 * 256)}, None)) == {}
    importlib.import_module("torch.distributed.fsdp")  # registers FSDP2's fsdp.chunk_cat
    grads = [fake(*s) for s in block]
    assert dict(cw.workspace_bytes(torch.ops.fsdp.chunk_cat.default, (grads, 0, 2),
                                   {"out": fake(600000)}, None)) == {pack: 4320}
