"""A fake GPU: PyTorch's real CUDA build running a training step with no GPU and no driver.

A small C library (``stub.c``, compiled by :func:`build` with gcc against the CUDA headers
of the target environment, named ``libcuda.so.1``) is preloaded with ``LD_PRELOAD`` into a
subprocess. It answers the calls PyTorch makes to the CUDA runtime, the driver API, cuBLAS
and cuBLASLt as one H100 80GB (sm_90, 132 SMs) would: ``cudaMalloc`` hands out zero-filled
host memory (and fails past 80 GB), copies and memsets happen on the host, kernel launches
and GEMMs do nothing. :func:`measure_step` runs a step there and returns
``torch.cuda.max_memory_allocated()`` / ``max_memory_reserved()`` of the measured step.

cuDNN is answered too (``cudnn_stub.c``, compiled into the same library when the venv's
``nvidia/cudnn/include`` has the headers): the real libcudnn cannot run on the stub (its
statically linked CUDA runtime needs the driver's private export tables), so every ``cudnn*``
function PyTorch imports is defined there: handles and descriptors on the host, the backend
API cudnn_frontend drives with one engine per operation graph, cuDNN's RNN weight layout;
compute calls do nothing. Convolutions (forward, backward, transposed), cuDNN batch norm,
cuDNN LSTM/GRU and cuDNN attention run. **Sizes cuDNN would choose are the stub's**: each
execution plan (convolutions, attention graphs) and legacy convolution algorithm reports
``FAKEGPU_CUDNN_WORKSPACE`` bytes of workspace (default 0), and
batch-norm workspaces and reserve space, RNN workspace and reserve space and the dropout
state are 0 bytes; so PyTorch's own allocations around cuDNN are checked exactly, and the
prediction is given the same figure (``cuda_memory(B, cudnn_workspace=...)``).

NCCL is answered too (``nccl_stub.c``, compiled in when the venv's ``nvidia/nccl`` wheel has
``nccl.h``): :func:`fxmem.validate.fakegpu.ranks.call_ranks` starts W processes, each its own
fake device 0, in one ``ProcessGroupNCCL`` group (file-store rendezvous), so FSDP2, DDP and
TP steps run with PyTorch's own allocations around each collective (outputs, flat buffers,
the tensors a work keeps until waited), and ``ranks.measure_rank`` measures each rank.
Collectives move no data between processes (each rank sees what it would if all ranks held
its values); NCCL's own device buffers (channels, proxies, registrations) do not exist here,
as they are outside PyTorch's allocator on a GPU too.

What it shares with a real GPU run of the same PyTorch build:

- PyTorch's CUDA host code: dispatch, autograd, the optimizer's foreach/fused paths, the
  kernel (and cuBLAS/cuBLASLt path) selection made on the host from device properties;
- every allocation through the CUDACachingAllocator, with its real block sizes, rounding,
  splitting, caching and stream bookkeeping, so both peaks are PyTorch's own figures,
  including the cuBLAS workspaces PyTorch allocates itself.

What it cannot know:

- the CUDA context and the driver's own memory (not in PyTorch's figures anyway, but in
  ``nvidia-smi``'s);
- what cuBLAS, cuDNN, NCCL or other libraries allocate outside PyTorch's allocator, and
  the workspace sizes their heuristics would choose (the stub's cuBLASLt heuristic always
  returns one algorithm needing no workspace; cuDNN's sizes are the fixed ones above);
- anything that depends on computed values: kernels do not run, so tensor contents are
  garbage (deterministically: each block the caching allocator hands out reads as zero
  until the host copies or sets it, ``alloc_hook.cpp`` and stub.c ``fakegpu_block_zero``);
  data-dependent shapes
  (``nonzero``, boolean masks), ``.item()``-driven control flow (transformers'
  packed-sequence check, ``find_packed_sequence_indices``) and NaN checks see these values,
  not real ones; :func:`fxmem.measure` there takes a GradScaler's steps as finite (its
  ``found_inf`` is a fill no kernel made: a skipped step would otherwise depend on what
  the block held before);
- CUDA graphs, stream-ordered allocation (``cudaMallocAsync`` backend), expandable
  segments (the driver's virtual-memory API is reported unsupported), IPC, multi-GPU.

Usage::

    from fxmem.validate.fakegpu import measure_step
    r = measure_step("/path/to/cuda-venv/bin/python", "mymodule:make_step", kwargs={"B": 64})
    print(r.max_allocated, r.max_reserved)

fxmem itself runs there too (:mod:`fxmem.validate.fakegpu.remote`):
``fxmem.measure(model, x, y, ..., device="cuda", fake_gpu=PYTHON)`` measures a step of
yours in that Python, and ``fxmem validate --device cuda --fake-gpu PYTHON`` runs the
validation harness there (prediction and measurement under one release; goal: exact).

Many children: within ``with forkserver():`` each is forked from a process of that Python
that has already imported torch (:mod:`fxmem.validate.fakegpu.forkserver`), seconds saved
on each.

From a shell: ``python -m fxmem.validate.fakegpu run PYTHON module:function '{"B": 64}'``
prints the measured step as JSON; ``python -m fxmem.validate.fakegpu build OUT_DIR PYTHON``
prints the library's path, for running any script by hand:
``LD_PRELOAD=<that path> TRITON_LIBCUDA_PATH=<its folder> PYTHON script.py``
(``FAKEGPU_DEBUG=1`` logs device mallocs/frees, driver entry points the stub lacks and
cuDNN backend attributes it answers with none).
"""

from .build import build, find_cudnn_include_dir, find_include_dirs
from .forkserver import forkserver
from .run import FakeGPUError, StepResult, call, measure_step, measure_steps, stub_env

__all__ = ["build", "find_include_dirs", "find_cudnn_include_dir", "call", "measure_step",
           "measure_steps", "forkserver", "stub_env", "StepResult", "FakeGPUError"]
