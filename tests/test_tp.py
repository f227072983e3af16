"""Tensor parallel and FSDP2 x TP per rank (issue 18): each rank's predicted peak equals a
real multi-process run of the same step (gloo, on this machine's CPU,
fxmem.measure(..., parallel=...)), to the byte, at batch sizes other than the traced one;
ranks with uneven shards included."""

import gc

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import fxmem
from fxmem import FSDP, TP, Parallel
from test_fsdp import _exact  # analyse once, measure every rank at B = 3 and 17


class MLP(nn.Module):
    """Up, ReLU, down and a head; ``hidden`` rows split over the ranks (30 over 4: 8, 8, 8,
    6, uneven)."""

    def __init__(self, d=16, hidden=64, out=10):
        super().__init__()
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d)
        self.head = nn.Linear(d, out)

    def forward(self, x):
        return self.head(self.down(F.relu(self.up(x))))


MLP_PLAN = {"up": ColwiseParallel(), "down": RowwiseParallel()}


class Attention(nn.Module):
    """Multi-head self-attention whose reshapes take the local heads (``-1``), as Megatron's
    and HF's do, then an MLP; a stack of these and a head."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.head_dim = d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (f(x).view(b, n, -1, self.head_dim).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, n, -1))
        return x + self.down(F.gelu(self.up(x)))


class Blocks(nn.Module):
    def __init__(self, d=32, n=2, out=10):
        super().__init__()
        self.layers = nn.ModuleList([Attention(d) for _ in range(n)])
        self.head = nn.Linear(d, out)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


BLOCK_PLAN = {"layers.*.q": ColwiseParallel(), "layers.*.k": ColwiseParallel(),
              "layers.*.v": ColwiseParallel(), "layers.*.o": RowwiseParallel(),
              "layers.*.up": ColwiseParallel(), "layers.*.down": RowwiseParallel()}

STEP = dict(loss=F.cross_entropy, optimizer=torch.optim.Adam, device="cpu")


def _mlp_batch():
    torch.manual_seed(0)
    return torch.randn(4, 16), torch.randint(0, 10, (4,))


def _seq_loss(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def _blocks_batch():
    torch.manual_seed(0)
    return torch.randn(4, 8, 32), torch.randint(0, 10, (4, 8))


# up's output a DTensor: its global shape travels with it, so the rows may split unevenly
# (a local tensor would be taken as an even shard by RowwiseParallel's DTensor.from_local)
UNEVEN_PLAN = {"up": ColwiseParallel(use_local_output=False), "down": RowwiseParallel()}


@pytest.mark.parametrize("world,hidden,plan,groups", [
    (2, 64, MLP_PLAN, [(0, 1)]),
    (4, 64, MLP_PLAN, [(0, 1, 2, 3)]),
    (4, 30, UNEVEN_PLAN, [(0, 1, 2), (3,)]),  # 30 rows over 4 ranks: 8, 8, 8, 6
])
def test_mlp_per_rank(world, hidden, plan, groups):
    torch.manual_seed(0)
    r = _exact(MLP(hidden=hidden), *_mlp_batch(), TP(world, plan))
    assert [g.ranks for g in r.groups] == groups


@pytest.mark.parametrize("world", [2, 4])
def test_attention_per_rank(world):
    torch.manual_seed(0)
    r = _exact(Blocks(), *_blocks_batch(), TP(world, BLOCK_PLAN), loss=_seq_loss)
    assert [g.ranks for g in r.groups] == [tuple(range(world))]


def test_the_shards_are_the_parts():
    """Params per rank are the planned layers' shards (rows for colwise, columns for
    rowwise, the rowwise bias whole) and the unplanned head whole."""
    m = MLP()
    r = fxmem.analyze(m, *_mlp_batch(), parallel=TP(4, MLP_PLAN), **STEP)
    sharded = (m.up.weight.numel() + m.up.bias.numel() + m.down.weight.numel()) // 4
    whole = m.down.bias.numel() + m.head.weight.numel() + m.head.bias.numel()
    assert r.parts(0)["params"] == 4 * (sharded + whole)


def _llama(kv_heads=2):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=kv_heads, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


LLAMA_PLAN = {"model.layers.*.self_attn.q_proj": ColwiseParallel(),
              "model.layers.*.self_attn.k_proj": ColwiseParallel(),
              "model.layers.*.self_attn.v_proj": ColwiseParallel(),
              "model.layers.*.self_attn.o_proj": RowwiseParallel(),
              "model.layers.*.mlp.gate_proj": ColwiseParallel(),
              "model.layers.*.mlp.up_proj": ColwiseParallel(),
              "model.layers.*.mlp.down_proj": RowwiseParallel()}


def _lm_loss(out, y):
    return F.cross_entropy(out.logits.flatten(0, 1), y.flatten())


def test_llama_tp2():
    """HF Llama's attention reshapes to ``(*input_shape, -1, head_dim)``: with the q, k, v
    projections colwise each rank runs its local heads (2 of 4 query heads, 1 of 2 key and
    value heads; the 2 key-value heads do not split over 4 ranks)."""
    m = _llama()
    ids = torch.randint(0, 128, (2, 16))
    _exact(m, ids, ids, TP(2, LLAMA_PLAN), batches=(3, 5), loss=_lm_loss,
           optimizer=torch.optim.AdamW)


def test_llama_own_plan():
    """``TP(2)``: the model's own Hugging Face plan (``model.tp_plan``), as PyTorch's styles:
    beside the layers of LLAMA_PLAN the embedding is vocabulary-parallel and the head's
    logits are all-gathered (``colwise_gather_output``)."""
    m = _llama()
    ids = torch.randint(0, 128, (2, 16))
    plan = fxmem.trace.parallel.tp.hf_plan(m)
    assert set(plan) == set(LLAMA_PLAN) | {"model.embed_tokens", "lm_head"}
    r = _exact(m, ids, ids, TP(2), batches=(3, 5), loss=_lm_loss,
               optimizer=torch.optim.AdamW)
    assert "Hugging Face plan" in r.strategy.name
    # DTensor's view rule asks whether B divides by 2; the step is the same either way
    assert not [g for g in r.rank(0).valid_when if "Mod" in str(g)]
    # the embedding's and the head's weights are split too: fewer bytes than LLAMA_PLAN's
    mine = fxmem.analyze(m, ids, ids, parallel=TP(2, LLAMA_PLAN), loss=_lm_loss,
                         optimizer=torch.optim.AdamW, device="cpu")
    assert r.rank(0).parts["params"] < mine.rank(0).parts["params"]


def test_llama_own_plan_tp4():
    """Four ranks: with 4 key-value heads each rank runs one query and one key-value head;
    the vocabulary (128) and the MLP (64) split in four."""
    m = _llama(kv_heads=4)
    ids = torch.randint(0, 128, (2, 16))
    r = _exact(m, ids, ids, TP(4), batches=(3, 5), loss=_lm_loss,
               optimizer=torch.optim.AdamW)
    assert [g.ranks for g in r.groups] == [(0, 1, 2, 3)]


def test_fsdp_x_tp_blocks():
    """FSDP2 over dp=2 of TP over tp=2: 4 processes on a (2, 2) mesh named ("dp", "tp")."""
    p = Parallel(fsdp=FSDP(2), tp=TP(2, BLOCK_PLAN))
    torch.manual_seed(0)
    r = _exact(Blocks(), *_blocks_batch(), p, loss=_seq_loss)
    assert p.world_size == 4 and p.mesh_shape == (2, 2)
    assert [g.ranks for g in r.groups] == [(0, 1, 2, 3)]


def test_hsdp_x_tp():
    """HSDP (2 replicas of 1 shard) over TP 2: a (replicate, shard, tp) mesh of 4 ranks."""
    p = Parallel(fsdp=FSDP(2, replicate=2), tp=TP(2, MLP_PLAN))
    assert p.mesh_shape == (2, 1, 2) and p.mesh_dim_names == ("replicate", "shard", "tp")
    _exact(MLP(), *_mlp_batch(), p)


def test_fsdp_x_tp_llama():
    m = _llama()
    ids = torch.randint(0, 128, (2, 16))
    _exact(m, ids, ids, Parallel(fsdp=FSDP(2), tp=TP(2, LLAMA_PLAN)), batches=(3, 5),
           loss=_lm_loss, optimizer=torch.optim.AdamW)


def test_nothing_changes_outside():
    """The user's model keeps its parameters and class; no process group is left."""
    m = MLP()
    before = [(id(p), type(p)) for p in m.parameters()]
    fxmem.analyze(m, *_mlp_batch(), parallel=TP(2, MLP_PLAN), **STEP)
    fxmem.analyze(m, *_mlp_batch(), parallel=Parallel(fsdp=FSDP(2), tp=TP(2, MLP_PLAN)),
                  **STEP)
    gc.collect()
    assert [(id(p), type(p)) for p in m.parameters()] == before
    assert type(m) is MLP and not dist.is_initialized()
    assert "resize_" not in vars(torch.UntypedStorage)


@pytest.mark.parametrize("make,words", [
    (lambda: TP(0, MLP_PLAN), "world_size"),
    (lambda: TP(2, {}), "plan"),
    (lambda: TP(2, {"up": "colwise"}), "plan"),
    (lambda: TP(2, ["up"]), "plan"),
    (lambda: Parallel(fsdp=2, tp=TP(2, MLP_PLAN)), "fsdp"),
    (lambda: Parallel(fsdp=FSDP(2), tp=4), "tp"),
])
def test_bad_strategies(make, words):
    with pytest.raises(fxmem.InputError, match=words) as e:
        make()
    assert "\n" not in str(e.value)


def test_bad_uses():
    x, y = _mlp_batch()
    with pytest.raises(fxmem.InputError, match="no submodule 'mid'"):
        fxmem.analyze(MLP(), x, y, parallel=TP(2, {"mid": ColwiseParallel()}), **STEP)
    with pytest.raises(fxmem.InputError, match="TP"):
        fxmem.analyze(MLP(), x, y, parallel="tp", **STEP)
    with pytest.raises(fxmem.InputError, match="on the CPU"):
        fxmem.measure(MLP(), x, y, B=2, parallel=TP(2, MLP_PLAN), **{**STEP, "device": "cuda"})


class SeqMLP(nn.Module):
    """A pre-norm residual MLP and a head; with the sequence-parallel plan each rank is
    given its own stretch of the sequence, the norm runs on it, ``up`` all-gathers the
    sequence and ``down`` reduce-scatters it back (Megatron's sequence parallelism)."""

    def __init__(self, d=32, out=10):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.head = nn.Linear(d, out)

    def forward(self, x):
        return self.head(x + self.down(F.gelu(self.up(self.norm(x)))))


def test_sequence_parallel():
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import SequenceParallel

    plan = {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1))}
    torch.manual_seed(0)
    _exact(SeqMLP(), *_blocks_batch(), TP(2, plan), loss=_seq_loss)


def test_fsdp_x_tp_uneven():
    """dp=2 x tp=2 with 30 hidden rows: each tp rank holds 15, which FSDP2 splits 8 and 7
    over dp; rank r is (dp r // 2, tp r % 2), so ranks 0, 1 hold 8 rows and ranks 2, 3
    hold 7."""
    torch.manual_seed(0)
    p = Parallel(fsdp=FSDP(2), tp=TP(2, UNEVEN_PLAN))
    r = _exact(MLP(hidden=30), *_mlp_batch(), p)
    assert [g.ranks for g in r.groups] == [(0, 1), (2, 3)]


# FSDP2 pads a shard's storage to its data-parallel group's first shard: 20 rows over tp 2
# are 10 and 10, over dp 3 4, 4 and 2; 17 over tp 2 are 9 and 8, over dp 4 3, 3, 3, 0 and
# 2, 2, 2, 2
GROUPED = [
    (TP(4, UNEVEN_PLAN), 30),
    (TP(3, MLP_PLAN), 64),
    (Parallel(fsdp=FSDP(2), tp=TP(2, UNEVEN_PLAN)), 30),
    (Parallel(fsdp=FSDP(3), tp=TP(2, UNEVEN_PLAN)), 20),
    (Parallel(fsdp=FSDP(4), tp=TP(2, UNEVEN_PLAN)), 17),
    (Parallel(fsdp=FSDP(4, replicate=2), tp=TP(2, UNEVEN_PLAN)), 30),
]


@pytest.mark.parametrize("parallel,hidden", GROUPED, ids=[f"{p.name}-{h}" for p, h in GROUPED])
def test_rank_groups_are_those_of_every_rank_wrapped(parallel, hidden, monkeypatch):
    # one copy wrapped, the other ranks' shapes by DTensor's arithmetic, each group's first
    # and last rank wrapped to check it: the groups of wrapping a copy as every rank
    from fxmem.trace.parallel import tp

    model = MLP(hidden=hidden)
    wrapped = []
    real = tp._wrapped_key
    monkeypatch.setattr(tp, "_wrapped_key", lambda p, m, r: wrapped.append(r) or real(p, m, r))
    groups = parallel.rank_groups(model)
    assert sorted(wrapped) == sorted({r for g in groups for r in (g[0], g[-1])})
    assert groups == tp._wrapped_groups(parallel, model)
    assert len(groups) > 1


def test_rank_groups_the_arithmetic_got_wrong_are_found_by_wrapping_every_rank(monkeypatch):
    from fxmem.trace.parallel import tp

    parallel, model = Parallel(fsdp=FSDP(2), tp=TP(2, UNEVEN_PLAN)), MLP(hidden=30)
    monkeypatch.setattr(tp, "_local_shapes", lambda layout, p: [()] * p.world_size)
    assert parallel.rank_groups(model) == ((0, 1), (2, 3))


LLAMA_CLI = ["hf:llama", "--config", "num_hidden_layers=2", "--config", "hidden_size=32",
             "--config", "intermediate_size=64", "--config", "num_attention_heads=4",
             "--config", "num_key_value_heads=2", "--config", "vocab_size=128",
             "--seq", "16", "--optimizer", "adamw", "--device", "cpu", "--batch", "3",
             "--format", "json"]


def _llama_cli_target():
    """The model ``LLAMA_CLI`` names, as the command line loads it, and its input."""
    from fxmem.cli.targets import load_target, parse_tensor

    t = load_target("hf:llama", {"num_hidden_layers": 2, "hidden_size": 32,
                                 "intermediate_size": 64, "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "vocab_size": 128}, seq=16)
    return t, parse_tensor(t.inputs[0], 8, t.dims)


@pytest.mark.parametrize("extra,strategy", [
    (["--tp", "2"], lambda: TP(2)),
    (["--tp", "2", "--fsdp", "2"], lambda: Parallel(fsdp=FSDP(2), tp=TP(2))),
])
def test_command_line(extra, strategy):
    """``fxmem analyze hf:llama --tp 2``: the model's own plan; with ``--fsdp 2``, FSDP2 over
    it on a (2, 2) mesh; the same figures as the library's on the same model."""
    import json

    from click.testing import CliRunner

    from fxmem.cli.command import cli
    from fxmem.cli.targets import named_dims

    r = CliRunner().invoke(cli, ["analyze", *LLAMA_CLI, *extra])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    t, ids = _llama_cli_target()
    report = fxmem.analyze(t.model, (ids, ids.clone()), parallel=strategy(), loss=None,
                           optimizer=torch.optim.AdamW, device="cpu",
                           dims=named_dims(t.inputs)).at(L=16)
    assert doc["setup"]["parallel"] == strategy().name
    assert doc["peak_bytes"] == report.peak_bytes(3)


@pytest.mark.slow  # three traces on CUDA (17 s); the flag's refusal is in the fast tier
def test_command_line_no_foreach():
    """On CUDA the foreach step over TP's shards and whole norms fails as eager PyTorch's
    does; its error's first way out is a flag, ``--no-foreach``, with the library's figures
    for ``optimizer=lambda p: torch.optim.AdamW(p, foreach=False)``; an optimizer with no
    ``foreach=`` is told so."""
    import json

    from click.testing import CliRunner

    from fxmem.cli.command import cli
    from fxmem.cli.targets import named_dims

    cuda = [a for a in LLAMA_CLI if a != "cpu"]  # on CUDA at B = 4 (its trace: B even)
    cuda[cuda.index("--device") + 1:cuda.index("--device") + 1] = ["cuda"]
    cuda[cuda.index("--batch") + 1] = "4"
    failed = CliRunner().invoke(cli, ["analyze", *cuda, "--tp", "2"])
    assert failed.exit_code == 3 and "--no-foreach" in failed.output, failed.output
    r = CliRunner().invoke(cli, ["analyze", *cuda, "--tp", "2", "--no-foreach"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    t, ids = _llama_cli_target()
    report = fxmem.analyze(t.model, (ids, ids.clone()), parallel=TP(2), loss=None,
                           optimizer=lambda p: torch.optim.AdamW(p, foreach=False),
                           device="cuda", dims=named_dims(t.inputs)).at(L=16)
    assert doc["setup"]["optimizer"] == "adamw (foreach=False)"
    assert doc["peak_bytes"] == report.peak_bytes(4)


def test_command_line_foreach_needs_an_optimizer_that_has_one():
    from click.testing import CliRunner

    from fxmem.cli.command import cli

    lbfgs = [*LLAMA_CLI[:LLAMA_CLI.index("--optimizer")], "--optimizer", "lbfgs",
             *LLAMA_CLI[LLAMA_CLI.index("--optimizer") + 2:], "--no-foreach"]
    refused = CliRunner().invoke(cli, ["analyze", *lbfgs])
    assert refused.exit_code == 2 and "has no foreach implementation" in refused.output
    none = [a for a in LLAMA_CLI if a not in ("--optimizer", "adamw")] + ["--foreach"]
    refused = CliRunner().invoke(cli, ["analyze", *none])
    assert refused.exit_code == 2 and "--foreach sets the optimizer's foreach=" in refused.output


def test_command_line_with_a_plan_file():
    """``--tp-plan FILE.py:NAME``: the user's plan, the same figures as the library's."""
    import json

    from click.testing import CliRunner

    from fxmem.cli.command import cli

    r = CliRunner().invoke(cli, [
        "analyze", "tests/test_tp.py:MLP", "--input", "B,16", "--target", "B:int64:10",
        "--optimizer", "adam", "--device", "cpu", "--tp", "4", "--tp-plan",
        "tests/test_tp.py:UNEVEN_PLAN", "--config", "hidden=30", "--batch", "6",
        "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    report = fxmem.analyze(MLP(hidden=30), *_mlp_batch(), parallel=TP(4, UNEVEN_PLAN), **STEP)
    assert doc["setup"]["parallel"] == "TP over 4 ranks"
    assert doc["peak_bytes"] == max(report.peak_bytes(6, rank=k) for k in range(4))


@pytest.mark.parametrize("make", [
    lambda: fxmem.DDP(2), lambda: fxmem.DDP(2, zero1=True), lambda: TP(2, BLOCK_PLAN),
    lambda: Parallel(fsdp=FSDP(2), tp=TP(2, BLOCK_PLAN)),
], ids=["DDP", "ZeRO-1", "TP", "FSDP2xTP"])
def test_composes_with_checkpointing_and_autocast(make):
    """Each strategy with a block checkpointed (checkpoint_wrapper, applied before the
    wrapping, as torchtitan does) and CPU autocast to bfloat16 at once: exact per rank."""
    m = fxmem.apply_checkpoints(Blocks(), ["layers.0"])
    r = _exact(m, *_blocks_batch(), make(), loss=_seq_loss, amp=torch.bfloat16)
    # the plan reaches the checkpointed block's layers too: the shards are the same
    plain = fxmem.analyze(Blocks(), *_blocks_batch(), parallel=make(),
                          **{**STEP, "loss": _seq_loss})
    assert r.parts(0)["params"] == plain.parts(0)["params"]


def test_a_foreach_step_over_shards_and_whole_parameters_fails_as_eager():
    """On CUDA torch.optim steps foreach by default, and the Llama's own plan leaves its norms
    plain tensors beside the DTensor shards: PyTorch's foreach ops refuse the mix (eager too:
    "got mixed torch.Tensor and DTensor"), said as the model's error with the ways out before
    the step is traced (it had been said as a limit of tracing, once the whole step was);
    stepped per parameter the same step is traced."""
    m = _llama()
    ids = torch.randint(0, 128, (2, 16))
    with pytest.raises(fxmem.ModelError, match="foreach step fails as eager") as e:
        fxmem.analyze(m, ids, ids, parallel=TP(2), loss=_lm_loss, optimizer=torch.optim.AdamW)
    # said before the step is traced: the group's 16 shards (two layers' 7 projections, the
    # embedding, the head) and its 5 norms, whole
    assert "16 of a group's parameters are DTensors, 5 are not" in str(e.value)
    assert "foreach=False" in str(e.value) and "\n" not in str(e.value)
    r = fxmem.analyze(m, ids, ids, parallel=TP(2), loss=_lm_loss,
                      optimizer=lambda p: torch.optim.AdamW(p, foreach=False))
    assert r.peak_bytes(4) > 0


def test_qwen3_own_plan():
    """Qwen3's plan keeps its per-head norms whole on every rank, their gradients summed in
    place (Hugging Face's ``replicated_with_grad_allreduce``: nothing PyTorch's styles apply);
    its projections split as Llama's. Predicted and measured per rank at B = 3 and 5 alike."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=8,
                                   max_position_embeddings=64)
    m = transformers.Qwen3ForCausalLM(cfg)
    plan = fxmem.trace.parallel.tp.hf_plan(m)
    assert not [k for k in plan if "norm" in k]
    assert set(m.tp_plan.values()) >= {"replicated_with_grad_allreduce", "colwise"}
    ids = torch.randint(0, 128, (2, 16))
    r = _exact(m, ids, ids, TP(2), batches=(3, 5), loss=_lm_loss,
               optimizer=torch.optim.AdamW)
    assert r.peak_bytes(5) == max(r.peak_bytes(5, rank=k) for k in range(2))
