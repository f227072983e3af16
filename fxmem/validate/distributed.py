"""Ground truth for data parallelism: the real step in ``world_size`` processes on the CPU,
each rank measured as :func:`fxmem.measure` measures one process.

The processes are forked from this one (so the model, loss and optimizer factory need not
be picklable), meet through a file store in a temporary folder, and talk over gloo on the
loopback interface only (``GLOO_SOCKET_IFNAME=lo``). Each wraps the model as the strategy
says (:meth:`fxmem.FSDP.apply`, :meth:`fxmem.DDP.apply`), runs the warm-up steps, and
measures its next step's live storage bytes, FSDP2's in-place storage resizes included
(:func:`fxmem.trace.ledger.tracking.storage_resizes`). Every process is waited for within
``timeout`` seconds, then killed; nothing outlives the call. The collectives allocate as
NCCL's do on a GPU, not as gloo's (:func:`_as_nccl_allocates`): what the prediction models.

Each rank feeds the same batch (the example tiled to B): data parallelism feeds ranks
different samples of the same shapes, which take the same memory.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import tempfile
import time
from datetime import timedelta

import torch

from ..errors import FxmemError, InputError
from ..trace.parallel import DDP, Kept

LOOPBACK = "lo"  # gloo's interface: the processes talk on this machine only

# torch.distributed's collectives the wrappers call (2.11's names and 2.13's)
COLLECTIVES = ("all_gather_into_tensor", "all_gather_single", "reduce_scatter_tensor",
               "reduce_scatter_single", "all_reduce", "broadcast", "all_gather",
               "reduce_scatter", "all_to_all_single")
REDUCE_SCATTERS = ("reduce_scatter_tensor", "reduce_scatter_single")
# a collective's worker thread lets go of its tensors within this, even on a loaded machine
# (2 cores, 4 ranks and a test session: 2 ms was not always enough for TP's all-reduces)
SETTLE_SECONDS = 0.01


class _Done:
    """The work of a collective already done (what an ``async_op=True`` call returns)."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _as_nccl_allocates() -> None:
    """In a rank's process (never in the caller's), the collectives allocate as NCCL's do:

    - a reduce-scatter writes the rank's chunk into the output and allocates nothing
      through PyTorch. Gloo's clones the whole input first and copies the chunk out when
      waited (``ProcessGroupGloo.cpp``, ``reduce_scatter_tensor_coalesced``:
      ``buffers.push_back(inputTensors[i].clone())``): an input-sized buffer NCCL does not
      have, which set the peak of a mixed-precision FSDP2 step. Here it reduces the input
      in place with ``all_reduce`` (gloo's works on the tensor's own memory) and copies the
      rank's chunk (averaged for ``ReduceOp.AVG``); the input is the caller's scratch
      buffer (FSDP2's ``reduce_scatter_input``), not read again;
    - each synchronous collective returns only after gloo's worker thread has let go of
      the tensors it held: gloo's work object holds its inputs and outputs until that
      thread drops it, a moment after ``wait`` returns, so a tensor whose last reference it
      is would be freed at a random later op and the measured peak vary by its size
      between runs (seen: 64 bytes at world size 4). The trace frees it when Python lets
      go of it."""
    import torch.distributed as dist

    def reduce_scatter(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False,
                       _fallback=None):
        avg = op == dist.ReduceOp.AVG
        if not (avg or op == dist.ReduceOp.SUM):
            return _fallback(output, input, op=op, group=group, async_op=async_op)
        dist.all_reduce(input, op=dist.ReduceOp.SUM, group=group)
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        chunk = input.reshape(world, -1)[rank].view(output.shape)
        output.copy_(chunk)
        if avg:
            output.div_(world)
        return _Done() if async_op else None

    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is None:
            continue
        if name in REDUCE_SCATTERS:
            fn = functools.partial(reduce_scatter, _fallback=fn)

        def settled(*args, _fn=fn, **kwargs):
            out = _fn(*args, **kwargs)
            if not kwargs.get("async_op", False):
                time.sleep(SETTLE_SECONDS)
            return out

        setattr(dist, name, settled)


def measure_ranks(model, spec, parallel, B: int, measure_one, timeout: float = 300.0):  # noqa: N803
    """One :class:`fxmem.Measurement` per rank, rank 0 first: the real step of ``spec`` at
    batch size ``B`` per rank, ``model`` wrapped by ``parallel`` in each of its processes.
    ``measure_one(model, params)`` measures one process's step (the CPU protocol of
    :func:`fxmem.measure`); for :class:`fxmem.DDP`, ``measure_one(model, params, kept=)``
    with the :class:`fxmem.trace.parallel.ddp.Kept` that saw DDP's construction."""
    if "fork" not in multiprocessing.get_all_start_methods():
        raise InputError("measuring a data-parallel step needs processes started by fork "
                         "(Linux or macOS)")
    ctx = multiprocessing.get_context("fork")
    world = parallel.world_size
    with tempfile.TemporaryDirectory(prefix="fxmem-dist-") as tmp:
        store = os.path.join(tmp, "store")
        procs, conns = [], []
        try:
            for rank in range(world):
                recv, send = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_rank_main, daemon=True,
                                args=(rank, world, store, send, model, parallel, measure_one,
                                      timeout))
                p.start()
                send.close()
                procs.append(p)
                conns.append(recv)
            results = _gather(procs, conns, time.monotonic() + timeout)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                p.join(5)
            for c in conns:
                c.close()
    failed = [(r, msg) for r, (kind, msg) in enumerate(results) if kind != "ok"]
    if failed:
        rank, msg = failed[0]
        if "fork-based multiprocessing" in msg:  # fxmem.trace.kernels.compat.plain_backward_first
            msg = ("autograd cannot run in a process forked from this one: on a CUDA build "
                   "of torch, this process's first backward ran on fake tensors outside "
                   "fxmem (fxmem runs a plain one first); measure the parallel step from a "
                   "fresh process")
        raise FxmemError(f"the real {parallel.name} step failed on rank {rank}: {msg}")
    return tuple(m for _, m in results)


def _gather(procs, conns, deadline: float) -> list:
    results: list = [None] * len(procs)
    pending = set(range(len(procs)))
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            for r in pending:
                results[r] = ("error", "no answer within the time limit (killed)")
            break
        ready = multiprocessing.connection.wait([conns[r] for r in pending], timeout=left)
        for c in ready:
            r = conns.index(c)
            try:
                results[r] = c.recv()
            except EOFError:
                results[r] = ("error", f"the process ended without an answer (exit code "
                                       f"{procs[r].exitcode})")
            pending.discard(r)
    return results


def _rank_main(rank, world, store_path, conn, model, parallel, measure_one, timeout) -> None:
    """One rank's process: join the group, wrap, measure, send the result, exit at once
    (the parent's exit handlers are not this process's to run)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    code = 0
    try:
        os.environ["GLOO_SOCKET_IFNAME"] = LOOPBACK
        torch.set_num_threads(1)
        _as_nccl_allocates()
        store = dist.FileStore(store_path, world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout))
        mesh = init_device_mesh("cpu", parallel.mesh_shape,
                                mesh_dim_names=parallel.mesh_dim_names)
        if isinstance(parallel, DDP):  # what its construction keeps (the buckets) seen
            kept = Kept()
            kept.know([*model.parameters(), *model.buffers()])
            with kept:
                model = parallel.apply(model, mesh)  # this process's own copy (fork)
            conn.send(("ok", measure_one(model, list(model.parameters()), kept=kept)))
        else:
            model = parallel.apply(model, mesh) or model  # this process's own copy (fork)
            conn.send(("ok", measure_one(model, list(model.parameters()))))
    except BaseException as e:  # noqa: BLE001 - sent to the parent, which raises
        code = 1
        try:
            conn.send(("error", f"{type(e).__name__}: {e}".splitlines()[0]))
        except (OSError, ValueError):
            pass
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        finally:
            conn.close()
            os._exit(code)
