"""Every activation and pointwise function of ``torch.nn.functional``, traced and measured.

The cases are enumerated, not picked: every name in ``torch.nn.modules.activation.__all__``
and ``torch.nn.modules.dropout.__all__`` (a module PyTorch adds fails
:func:`test_every_module_is_a_case` until it is given a case or a stated exclusion), the
``inplace=True`` variant of each module that has one, every in-place function of
``torch.nn.functional`` (``F.relu_``, ``F.hardtanh_``, ...), and the pointwise functions that
are no module's forward (``F.gelu(approximate="tanh")``, ``F.normalize``, ``torch.sigmoid_``,
softmax with ``dtype=``, the SiLU, Mish and GPT-2 GELU decompositions as models write them).
A case that runs exactly the aten ops of another (``ReLU6`` is ``Hardtanh``, ``F.relu_`` is
``ReLU(inplace=True)``) is that case's alias: checked to be so, then covered by it.

Each case runs in a small net, Conv2d -> BatchNorm2d -> act -> Conv2d (batch norm saves its
input, not the activation's), traced once at B = 4 and compared with a real eager CPU step
(``fxmem.measure``) at B = 2 and 5, in training (Adam) and in eval (``model.eval()``,
``train=False``), in float32 and under CPU autocast (bfloat16): the peak and each phase's
peak, to the byte.

Under the CUDA rules (``device="cuda"``), where no measurement can be made here, in a second
net, Linear -> act -> Linear (Conv2d -> act -> Conv2d for activations of images):

- CUDA's autocast lists (fxmem.trace.kernels.amp, float16) with the CPU's kernels: the trace against
  a real CPU step run under the same emulated lists, so the Linear net is measured too;
- CUDA's kernels derived from the CPU's: op for op and storage for storage the same trace,
  live bytes after every op those of the CPU kernels' trace in 512-byte blocks, except where
  a rule of fxmem.trace.kernels.cuda.kernels says what CUDA's kernel does instead (then only the
  activation's ops differ);
- in a CUDA build of PyTorch (no GPU needed), the activation's forward on fake CUDA tensors
  under CUDA's own autocast: its ops, the storages they make and the tensors autograd saves
  are what fxmem's CUDA trace records.
"""

import contextlib
import inspect
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

import fxmem
from fxmem.memory.graph import build_graph
from fxmem.memory.liveness import liveness, parts_of
from fxmem.report.result import Report
from fxmem.trace import trace
from fxmem.trace.kernels.amp import emulate
from fxmem.trace.kernels.cuda import kernels as cuda_kernels

ACTIVATION = torch.nn.modules.activation
DROPOUT = torch.nn.modules.dropout
aten = torch.ops.aten
BATCHES = (2, 5)  # traced at B = 4
LOSS = {"loss": lambda o: o.float().sum()}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny kernels: one intra-op thread keeps the file fast on a loaded machine (the memory
    counted, live storages, does not depend on it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- the cases ------------------------------------------------------------------------------

# Constructor arguments where a module has required ones or an implicit default: softmax's
# dim=None is deprecated (the dim is guessed), GLU halves dim 1 (features, channels).
ARGS = {
    "Threshold": {"threshold": 0.1, "value": 0.0},
    "Softmax": {"dim": 1}, "Softmin": {"dim": 1}, "LogSoftmax": {"dim": 1}, "GLU": {"dim": 1},
}
EXCLUDED = {
    "MultiheadAttention": "attention, not a pointwise op: its kernels (scaled_dot_product_"
                          "attention, the in-projection matmuls) are tests/test_sdpa.py's",
}
# modules that need an input the Linear net does not give (Softmax2d: 3-d or 4-d; Dropout1d:
# (N, C, L) or (C, L) only; Dropout2d/3d and FeatureAlphaDropout: channels, so images)
IMAGE_ONLY = {"Softmax2d", "Dropout2d", "Dropout3d", "FeatureAlphaDropout"}
LINEAR_ONLY = {"Dropout1d"}


class Fn(nn.Module):
    """A function as a module (its ops get a module path in the trace)."""

    def __init__(self, fn, name):
        super().__init__()
        self.fn, self.name = fn, name

    def forward(self, x):
        return self.fn(x)

    def extra_repr(self):
        return self.name


# Pointwise functions that are no module's forward, and in-place ones.
FUNCTIONS = {
    "F.gelu(approximate=tanh)": lambda x: F.gelu(x, approximate="tanh"),
    "F.logsigmoid": F.logsigmoid,
    "F.softmin(dim=1)": lambda x: F.softmin(x, dim=1),
    "F.softmax(dim=1, dtype=float32)": lambda x: F.softmax(x, dim=1, dtype=torch.float32),
    "F.log_softmax(dim=1, dtype=float32)": lambda x: F.log_softmax(x, 1, dtype=torch.float32),
    "F.normalize": F.normalize,
    "F.normalize(p=1, dim=0)": lambda x: F.normalize(x, p=1.0, dim=0),
    "F.dropout(p=0.3)": lambda x: F.dropout(x, 0.3),
    "F.dropout(p=0.3, inplace=True)": lambda x: F.dropout(x, 0.3, inplace=True),
    "F.alpha_dropout(training=True)": lambda x: F.alpha_dropout(x, 0.2, training=True),
    "F.rrelu(training=True)": lambda x: F.rrelu(x, training=True),
    "F.hardtanh(min_val=-2, max_val=2)": lambda x: F.hardtanh(x, -2.0, 2.0),
    "torch.sigmoid": torch.sigmoid,
    "torch.tanh": torch.tanh,
    "torch.sigmoid_": torch.sigmoid_,
    "torch.tanh_": torch.tanh_,
    "Tensor.relu_": lambda x: x.relu_(),
    "x * sigmoid(x)": lambda x: x * torch.sigmoid(x),  # timm's Swish, EfficientNet's SiLU
    "x * tanh(softplus(x))": lambda x: x * torch.tanh(F.softplus(x)),  # Mish written out
    "0.5 x (1 + tanh(...))": lambda x: 0.5 * x * (1.0 + torch.tanh(
        0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0)))),  # GPT-2's gelu_new
    "sigmoid(x) * x, in place": lambda x: x.mul_(torch.sigmoid(x)),
}
# in-place functions of torch.nn.functional, by name, with the arguments they need
INPLACE_ARGS = {"threshold_": (0.1, 0.0)}


def _call(fn, args, x):
    return fn(x, *args)


def _required(fn) -> int:
    """Parameters ``fn`` needs (0 when its signature cannot be read: a C builtin)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 0
    return sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               for p in params)


def _inplace_functions() -> dict:
    """The in-place pointwise functions of torch.nn.functional: public names ending in
    ``_`` that take the input and at most :data:`INPLACE_ARGS` (2.15's ``scaled_addmm_``,
    a scaled matrix product into its first argument, needs six more: no activation)."""
    out = {}
    for name in dir(F):
        if name.endswith("_") and not name.startswith("_"):
            args = INPLACE_ARGS.get(name, ())
            if _required(getattr(F, name)) <= 1 + len(args):
                out[f"F.{name}"] = partial(_call, getattr(F, name), args)
    return out


@dataclass(frozen=True)
class Case:
    name: str
    make: object  # () -> nn.Module
    nets: tuple = ("mlp", "cnn")


def _module_cases(namespace) -> list:
    cases = []
    for name in namespace.__all__:
        if name in EXCLUDED:
            continue
        cls = getattr(namespace, name)
        args = ARGS.get(name, {})
        nets = ("cnn",) if name in IMAGE_ONLY else ("mlp",) if name in LINEAR_ONLY else \
            ("mlp", "cnn")
        cases.append(Case(name, partial(cls, **args), nets))
        if "inplace" in inspect.signature(cls).parameters:
            cases.append(Case(f"{name}(inplace=True)", partial(cls, **args, inplace=True), nets))
    return cases


CASES = {c.name: c for c in [
    *_module_cases(ACTIVATION),
    Case("PReLU(8)", lambda: nn.PReLU(8)),  # one slope a channel (the default: one in all)
    *_module_cases(DROPOUT),
    *(Case(n, partial(Fn, f, n)) for n, f in {**FUNCTIONS, **_inplace_functions()}.items()),
]}


def test_every_module_is_a_case():
    """A module added to either namespace must get a case, or an exclusion with a reason."""
    for namespace in (ACTIVATION, DROPOUT):
        for name in namespace.__all__:
            assert name in CASES or name in EXCLUDED, name
            if name in CASES and "inplace" in inspect.signature(
                    getattr(namespace, name)).parameters:
                assert f"{name}(inplace=True)" in CASES, name
    assert {"F.relu_", "F.hardtanh_", "F.rrelu_", "F.threshold_"} <= set(CASES)


# Cases that run the very aten ops another case runs (same overloads, same outputs, in
# training and eval, float32, CPU autocast and CUDA's lists and kernels): the same memory, so
# the other case's tests cover them; :func:`test_alias_runs_the_same_ops` checks the claim.
ALIASES = {
    "ReLU6": "Hardtanh", "ReLU6(inplace=True)": "Hardtanh(inplace=True)",  # F.hardtanh(0, 6)
    "SELU": "ELU", "SELU(inplace=True)": "ELU(inplace=True)",  # elu with a scale
    "AlphaDropout(inplace=True)": "AlphaDropout",
    "FeatureAlphaDropout(inplace=True)": "FeatureAlphaDropout",
    "F.gelu(approximate=tanh)": "GELU", "F.logsigmoid": "LogSigmoid",
    "F.softmin(dim=1)": "Softmin", "F.rrelu(training=True)": "RReLU",
    "F.hardtanh(min_val=-2, max_val=2)": "Hardtanh",
    "torch.sigmoid": "Sigmoid", "torch.tanh": "Tanh", "Tensor.relu_": "ReLU(inplace=True)",
    "F.relu_": "ReLU(inplace=True)", "F.hardtanh_": "Hardtanh(inplace=True)",
    "F.elu_": "ELU(inplace=True)", "F.selu_": "ELU(inplace=True)",
    "F.celu_": "CELU(inplace=True)", "F.leaky_relu_": "LeakyReLU(inplace=True)",
    "F.threshold_": "Threshold(inplace=True)",
    "F.rrelu_": "RReLU(inplace=True)",  # training=False by default: the noise op still runs
}
REPRESENTATIVES = [name for name in CASES if name not in ALIASES]


# --- the nets -------------------------------------------------------------------------------

def _out_channels(act, shape) -> int:
    with torch.no_grad():
        return act(torch.randn(shape)).shape[1]


def linear_net(act) -> nn.Module:
    """Linear -> act -> Linear: the next Linear saves the activation's output; whether its
    input (the first Linear's output) is kept is the activation's business."""
    return nn.Sequential(nn.Linear(4, 8), act, nn.Linear(_out_channels(act, (2, 8)), 4))


def conv_net(act, norm=True) -> nn.Module:
    """Conv2d -> BatchNorm2d -> act -> Conv2d: batch norm saves its input, not its output,
    which an in-place activation overwrites."""
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), *([nn.BatchNorm2d(8)] if norm else []),
                         act, nn.Conv2d(_out_channels(act, (2, 8, 6, 6)), 4, 3, padding=1))


VECTOR, IMAGE = (4, 4), (4, 3, 6, 6)  # B = 4


def cpu_net(case: Case):
    """The net of the CPU checks: Conv2d -> BatchNorm2d -> act -> Conv2d (Linear -> act ->
    Linear for an activation of vectors only), and its input."""
    torch.manual_seed(0)
    if "cnn" in case.nets:
        return conv_net(case.make()), torch.randn(IMAGE)
    return linear_net(case.make()), torch.randn(VECTOR)


def single(case: Case):
    """The net of the CUDA checks, the activation at ``model[1]``: Linear -> act -> Linear,
    or Conv2d -> act -> Conv2d for an activation of images (no batch norm, whose CUDA rules
    are its own), and its input."""
    torch.manual_seed(0)
    if "mlp" in case.nets:
        return linear_net(case.make()), torch.randn(VECTOR)
    return conv_net(case.make(), norm=False), torch.randn(IMAGE)


ADAM = dict(**LOSS, optimizer=lambda p: torch.optim.Adam(p, fused=True))  # the fewest ops
AMP = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def _phase_peaks(report, b) -> dict:
    """The most bytes live right after an op of each phase allocated (``measure``'s
    ``phase_peak_bytes``: a phase that allocates nothing, fused Adam's, has none)."""
    peaks, ops = {}, report.trace.ops
    for p in report.timeline(b):
        if ops[p.index].new_sids:
            peaks[p.phase] = max(peaks.get(p.phase, 0), p.live_bytes)
    return peaks


def _assert_measured(report, model, x, kw, label):
    """The peak and each phase's peak at :data:`BATCHES`, against real CPU steps."""
    for b in BATCHES:
        m = fxmem.measure(model, x, B=b, **kw)
        assert (report.peak_bytes(b), _phase_peaks(report, b)) == \
            (m.peak_bytes, m.phase_peak_bytes), (*label, b)


# --- device="cpu": exact ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("case", REPRESENTATIVES)
def test_exact_on_cpu(case, mode, dtype):
    """Training with Adam, or eval (``model.eval()``, ``train=False``); float32 or CPU
    autocast: traced at B = 4, measured at B = 2 and 5."""
    model, x = cpu_net(CASES[case])
    if mode == "eval":
        model.eval()
    kw = dict(ADAM if mode == "train" else dict(**LOSS, train=False), device="cpu",
              amp=AMP[dtype])
    _assert_measured(fxmem.analyze(model, x, **kw), model, x, kw, (case, mode, dtype))


# --- aliases --------------------------------------------------------------------------------

class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace == "aten":
            self.ops.append((str(func), tuple((tuple(o.shape), o.dtype) for o in
                                              tree_leaves(out) if isinstance(o, torch.Tensor))))
        return out


SIGNATURE_CONFIGS = ("fp32 train", "fp32 eval", "bf16 train", "bf16 eval",
                     "cuda fp32 train", "cuda fp16 train")


def _signature(case: Case) -> tuple:
    """The aten ops (and their outputs) the activation runs, forward and backward, on fake
    tensors, in each of :data:`SIGNATURE_CONFIGS` (CPU autocast: bfloat16; cuda: CUDA's
    kernels, and its autocast lists for float16)."""
    shape = (2, 8) if "mlp" in case.nets else (2, 8, 6, 6)
    out = []
    for config in SIGNATURE_CONFIGS:
        train, cuda = config.endswith("train"), config.startswith("cuda")
        dtype = AMP[config.split()[-2]]
        stack = contextlib.ExitStack()
        with stack:
            if cuda:
                stack.enter_context(cuda_kernels.cuda_kernels())
                if dtype is not None:
                    stack.enter_context(emulate("cuda"))
            stack.enter_context(FakeTensorMode())
            torch.manual_seed(0)
            act = case.make().train(train)
            leaf = torch.randn(shape, requires_grad=True)
            log = _Ops()
            with torch.set_grad_enabled(train), torch.autocast("cpu", dtype=dtype or
                                                               torch.bfloat16,
                                                               enabled=dtype is not None):
                x = leaf * 1 if dtype is None else (leaf * 1).to(dtype)
                with log:
                    y = act(x)
            if train:
                with log:
                    y.float().sum().backward()
        out.append(tuple(log.ops))
    return tuple(out)


@pytest.mark.parametrize("alias", list(ALIASES))
def test_alias_runs_the_same_ops(alias):
    assert ALIASES[alias] in REPRESENTATIVES
    assert _signature(CASES[alias]) == _signature(CASES[ALIASES[alias]])


# --- device="cuda": CUDA's autocast lists, measured on CPU kernels ----------------------------

CUDA_STEP = dict(**LOSS, train=True, optimizer=None)  # CUDA's optimizer defaults aside
# CPU kernels without float16: CUDA's lists are measured in bfloat16 for these (the lists
# are the same for both dtypes)
NO_HALF_ON_CPU = {"RReLU": "rrelu_with_noise_out_cpu", "RReLU(inplace=True)":
                  "rrelu_with_noise_out_cpu"}
_traces: dict = {}


def _trace(case, dtype, device, kernel_semantics=True):
    """The single net's training step, traced once a session."""
    key = (case, dtype, device, kernel_semantics)
    if key not in _traces:
        model, x = single(CASES[case])
        _traces[key] = trace(model, x, **CUDA_STEP, device=device, amp=AMP[dtype],
                             kernel_semantics=kernel_semantics)
    return _traces[key]


def _cpu_sized(t):
    lv = liveness(build_graph(t), "cpu")
    return Report(lv, parts_of(lv), t.guards)


def _lists_dtype(case) -> str:
    return "bf16" if case in NO_HALF_ON_CPU else "fp16"


@pytest.mark.parametrize("case", REPRESENTATIVES)
def test_cuda_autocast_lists_exact_on_cpu_kernels(case):
    """Under CUDA's autocast lists (softplus, the softmaxes, exp, pow and normalize's norm in
    float32, prelu in float16, the rest as they come), with the CPU's kernels: the trace
    against a real CPU step run under the same lists."""
    dtype = _lists_dtype(case)
    t = _trace(case, dtype, "cuda", kernel_semantics=False)
    model, x = single(CASES[case])
    with emulate("cuda"):
        _assert_measured(_cpu_sized(t), model, x, dict(CUDA_STEP, amp=AMP[dtype]),
                         (case, "cuda lists", dtype))


# --- device="cuda": CUDA's kernels derived from the CPU's -------------------------------------

# Where CUDA's kernel allocates otherwise than the CPU's: the rules of
# fxmem.trace.kernels.cuda.kernels that say so (their ``op``), by case and dtype. Every other case
# and dtype: no rule applies.
DROPOUT_RULE, SOFTMAX_RULE = "dropout", "softmax.int, log_softmax.int"
LOG_SIGMOID_RULE, PRODUCT_RULE = "log_sigmoid_forward", "_softmax_backward_data"
SOFTMAXES = ("Softmax", "Softmin", "Softmax2d", "F.softmax(dim=1, dtype=float32)")
LOG_SOFTMAXES = ("LogSoftmax", "F.log_softmax(dim=1, dtype=float32)")
CUDA_RULES = {
    # Dropout.cpp dropout: native_dropout and its bool mask, in training
    **{name: dict.fromkeys(AMP, (DROPOUT_RULE,)) for name in ("Dropout", "F.dropout(p=0.3)")},
    # cuda/Activation.cpp log_sigmoid_forward_cuda: no buffer
    "LogSigmoid": dict.fromkeys(AMP, (LOG_SIGMOID_RULE,)),
    # cuda/SoftMax.cu softmax_backward_cuda_out: grad * output while it runs; and CUDA
    # autocast asks softmax for float32 (fp32_set_opt_dtype): SoftMax.cpp runs a float16 input
    # as _softmax(half_to_float=True), converts a bfloat16 one first
    **{name: {**dict.fromkeys(AMP, (PRODUCT_RULE,)), "fp16": (SOFTMAX_RULE, PRODUCT_RULE)}
       for name in SOFTMAXES},
    **{name: {"fp16": (SOFTMAX_RULE,)} for name in LOG_SOFTMAXES},
}
# float16 for every case (CUDA's lists and kernels together; its base, the CPU kernels'
# trace, is measured above); float32 where a rule applies in float32 too (to keep the file
# fast: every case's float32 trace is checked in a CUDA build by
# test_cuda_forward_is_the_cuda_builds); bfloat16 for the float16-only route
DERIVED = [(c, "fp16") for c in REPRESENTATIVES] + \
    [(c, "fp32") for c in REPRESENTATIVES if "fp32" in CUDA_RULES.get(c, {})] + \
    [(c, "bf16") for c in ("Softmax", "LogSoftmax")]  # the route's two ops


def _storages(t, op) -> list:
    return [(str(t.storages[s].size.expr), t.storages[s].dtype, t.storages[s].saved)
            for s in op.new_sids]


# activations whose CUDA rule changes what the module after them does, against the CPU's
# trace (float32): after Softmax2d, the convolution's cuDNN backward copies its gradient for
# each of its two calls (fxmem.trace.kernels.cuda.cudnn; 2,304 B each at B = 4, seen on 2.14.1's
# binary on the fake GPU, where fxmem's prediction of this net is exact in both peaks and
# allocation by allocation). Under autocast the reference is CUDA's own trace: copies alike.
CUDA_AFTER = {("Softmax2d", "fp32"): {"2"}}


def _differing_modules(cuda, base) -> set:
    """Module paths whose ops, or the storages they create, differ between two traces."""
    a = [(o.op, o.phase, o.module) for o in cuda.ops]
    b = [(o.op, o.phase, o.module) for o in base.ops]
    out = set()
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            out |= {x[2] for x in a[i1:i2] + b[j1:j2]}
            continue
        for i, j in zip(range(i1, i2), range(j1, j2)):
            if _storages(cuda, cuda.ops[i]) != _storages(base, base.ops[j]):
                out.add(cuda.ops[i].module)
    return out


def _with_sums_in_place(base, cuda):
    """``base`` with the gradient sums that ``cuda`` does in place done in place too: on CUDA
    autograd adds a second gradient into the first (fxmem.trace.kernels.grad_sums; a dispatch mode,
    under which the CPU's steps are measured, never does). The sum's storage takes no bytes,
    the first gradient's lives as long as the sum's. Ops are matched by index: where the two
    traces' ops differ, the comparison below fails anyway."""
    from dataclasses import replace

    from fxmem.formula.symbols import Size

    st, root = list(base.storages), {}  # a sum's storage -> the first gradient's of its chain
    for o in cuda.ops:
        made = [cuda.storages[s] for s in o.new_sids]
        if not (o.op == "aten.add.Tensor" and o.phase == "backward" and len(made) == 1
                and made[0].size.expr == 0 and o.index < len(base.ops)):
            continue
        b = base.ops[o.index]
        if b.op != o.op or len(b.new_sids) != 1 or not b.in_sids:
            continue
        c, a = st[b.new_sids[0]], st[root.get(b.in_sids[0], b.in_sids[0])]
        st[a.sid] = replace(a, freed_after=c.freed_after)
        st[c.sid] = replace(c, size=Size.of(0 * fxmem.B))
        root[c.sid] = a.sid
    return replace(base, storages=tuple(st))


@pytest.mark.parametrize("case,dtype", DERIVED)
def test_cuda_trace_is_the_cpu_trace_but_for_named_rules(case, dtype):
    """device="cuda" against the trace of the CPU's kernels (float32: device="cpu"; under
    autocast: CUDA's lists on the CPU's kernels, measured above). Without a rule: the same ops
    and storages, and the peak is the CPU trace's storages in 512-byte blocks, once the
    gradient sums CUDA's autograd does in place are done in place there too. With one: a rule
    of fxmem.trace.kernels.cuda.kernels, and only the activation's own ops differ."""
    cuda = _trace(case, dtype, "cuda")
    base = _trace(case, dtype, "cpu") if dtype == "fp32" else \
        _trace(case, dtype, "cuda", kernel_semantics=False)
    base = _with_sums_in_place(base, cuda)
    rules = CUDA_RULES.get(case, {}).get(dtype)
    differ = _differing_modules(cuda, base)
    if rules is None:
        assert differ == set(), (case, dtype)
        ours, derived = liveness(build_graph(cuda)), liveness(build_graph(base), "cuda")
        for b in (1, 2, 5, 37, 4096):  # live bytes after every op, so the peak too
            assert (ours.peak_bytes(b), ours.timeline(b)) == \
                (derived.peak_bytes(b), derived.timeline(b)), (case, dtype, b)
    else:
        assert set(rules) <= {r.op for r in cuda_kernels.RULES}
        # model[1], the activation, and what its CUDA output makes the next module do
        assert differ == {"1"} | CUDA_AFTER.get((case, dtype), set()), (case, dtype, rules)


# --- device="cuda": the forward PyTorch's CUDA build runs -----------------------------------

def _cuda_forward(case: Case, x_shape, dtype):
    """The activation's forward on fake CUDA tensors under CUDA's own autocast: ``(op,
    [(bytes, dtype) of each new storage])`` per op, and ``(bytes, dtype)`` of each storage
    autograd saves."""
    ops, saved, seen = [], [], WeakIdKeyDictionary()

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.namespace != "aten":
                return out
            new = []
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.untyped_storage() not in seen:
                    seen[t.untyped_storage()] = True
                    new.append((int(t.untyped_storage().nbytes()), t.dtype))
            ops.append((str(func), new))
            return out

    def pack(t):
        saved.append((int(t.untyped_storage().nbytes()), t.dtype))
        return t

    lower = AMP[dtype]
    before = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))
    with FakeTensorMode():
        with torch.device("cuda"):
            torch.manual_seed(0)
            act = case.make()
        x = torch.randn(x_shape, device="cuda", dtype=lower or torch.float32,
                        requires_grad=True) * 1
        for t in (x, *act.parameters(), *act.buffers()):
            seen[t.untyped_storage()] = True
        torch.set_autocast_enabled("cuda", lower is not None)
        torch.set_autocast_dtype("cuda", lower or torch.float16)
        try:
            with Log(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                act(x)
        finally:
            torch.set_autocast_enabled("cuda", before[0])
            torch.set_autocast_dtype("cuda", before[1])
            torch.clear_autocast_cache()
    return ops, sorted(saved, key=str)


def _traced_forward(t, b=4):
    """The same, read off fxmem's trace of the single net at B = ``b``: the ops of
    ``model[1]`` in the forward."""
    def size(s):
        return int(t.storages[s].size.expr.subs(fxmem.B, b))

    def made(o):  # its new storages in the order it returns them, as the log lists them
        # (the trace lists them in the order CUDA's kernel makes them:
        # fxmem.trace.kernels.cuda.call_order)
        outs = [s for s in dict.fromkeys(o.out_sids) if s in o.new_sids]
        return outs + [s for s in o.new_sids if s not in outs]

    ops = [(o.op, [(size(s), t.storages[s].dtype) for s in made(o)])
           for o in t.ops if o.phase == "forward" and o.module == "1"]
    saved = [(size(p.sid), t.storages[p.sid].dtype) for p in t.packs if p.module == "1"]
    return ops, sorted(saved, key=str)


@pytest.mark.skipif(not torch.backends.cuda.is_built(),
                    reason="needs a CUDA build of PyTorch (fake CUDA tensors; no GPU)")
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("case", REPRESENTATIVES)
def test_cuda_forward_is_the_cuda_builds(case, dtype):
    """fxmem's CUDA trace of the activation's forward (its ops, the storages they create,
    what autograd saves) against the CUDA build's own: its composites' CUDA branches, its
    CUDA autocast kernels and its meta kernels for CUDA tensors, run on fake CUDA tensors."""
    c = CASES[case]
    shape = (4, 8) if "mlp" in c.nets else (4, 8, 6, 6)
    assert _traced_forward(_trace(case, dtype, "cuda")) == _cuda_forward(c, shape, dtype)
