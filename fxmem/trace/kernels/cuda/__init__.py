"""CUDA kernel semantics on CPU fake tensors (``device="cuda"``):
:mod:`~fxmem.trace.kernels.cuda.kernels` (the rules table and the context the tracer enters),
:mod:`~fxmem.trace.kernels.cuda.sdpa` (CUDA's attention backend choice and kernels),
:mod:`~fxmem.trace.kernels.cuda.sdpa_memory` (what the attention kernels allocate beyond their
meta kernels), :mod:`~fxmem.trace.kernels.cuda.rnn` (cuDNN's RNNs and the fused cells),
:mod:`~fxmem.trace.kernels.cuda.workspaces` (other kernels' temporaries)."""
