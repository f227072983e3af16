"""What the device adds on top of live bytes, at one batch size:
:mod:`~fxmem.device.allocator` (``Report.cuda_memory``: the step's allocations replayed,
with cuBLAS's workspaces and cuDNN's on request), :mod:`~fxmem.device.caching_allocator`
(a pure-Python replay of PyTorch's CUDA caching allocator), :mod:`~fxmem.device.blocks`
(its segments, blocks, pools and expandable segments), :mod:`~fxmem.device.allocator_config`
(``PYTORCH_ALLOC_CONF`` and the size rounding)."""
