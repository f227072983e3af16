"""The CUDA rules table: every place where ``device="cuda"`` follows the CUDA build instead of
the CPU one (:mod:`fxmem.trace.kernels.cuda.kernels` applies them), with the PyTorch source each
follows, the releases whose sources it was read on, and the releases whose own CUDA builds,
run on the fake GPU (:mod:`fxmem.validate.fakegpu`), allocated what it predicts.

>>> from fxmem.trace.kernels.cuda.table import RULES
>>> [r.ran for r in RULES if r.op == "dropout"]
[('2.14', '2.15')]
"""

from __future__ import annotations

from dataclasses import dataclass

# PyTorch releases each rule was read on: 2.13's sources and binary for every rule; the SDPA
# rules also against 2.11's and 2.12's binaries (fxmem.trace.kernels.cuda.sdpa gates what differs);
# most others also against 2.11.0's (BOTH); the rest are consistent with 2.11's binary, not
# re-derived
CHECKED_ON = ("2.13",)
SDPA_CHECKED_ON = ("2.11", "2.12", "2.13")
# rules also confirmed in 2.11.0's CUDA wheel (its Python, its binary, fake CUDA tensors)
BOTH = ("2.11", "2.13")
# the CUDA builds CI runs on the fake GPU (2.15's C++ sources were not at hand to read: what
# changed in 2.15 was found, and is checked, on its binary)
FAKE_GPU = ("2.14", "2.15")


@dataclass(frozen=True)
class KernelRule:
    """One place where ``device="cuda"`` follows the CUDA build instead of the CPU one.

    ``op``: the aten op; ``kind``: ``"route"``, ``"outputs"`` or ``"workspace"`` (see the
    module docstring); ``cuda``: what the CUDA build does, in a sentence; ``follows``: the
    PyTorch source (file and function) the rule transcribes; ``checked``: the releases whose
    sources (or binary's symbols and strings) it was read on (every rule on 2.13, the one CI
    runs). ``ran``: the releases whose own CUDA build, run on the fake GPU
    (:mod:`fxmem.validate.fakegpu`), allocated exactly what fxmem predicts for ``cases``: the
    models of ``tests/fakegpu_targets.py``'s ``RULES`` or the tests of
    ``tests/test_fake_gpu*.py`` that show it, re-run by CI on those releases."""

    op: str
    kind: str
    cuda: str
    follows: str
    checked: tuple = CHECKED_ON
    ran: tuple = ()
    cases: tuple = ()


# --- the table: every rule, with the source it follows ----------------------------------------

RULES: tuple = (
    KernelRule("dropout", "route",
               "training with 0 < p < 1 runs native_dropout: the mask autograd keeps is bool "
               "(1 byte an element), not a copy of the input's dtype filled by bernoulli_",
               "aten/src/ATen/native/Dropout.cpp: dropout, is_fused_kernel_acceptable; "
               "aten/src/ATen/native/cuda/Dropout.cu: native_dropout_cuda",
               checked=BOTH,
               ran=FAKE_GPU, cases=("dropout",)),
    KernelRule("linear", "route",
               "a bias is added in place (output.add_(bias)) after matmul for an input "
               "neither 2-D nor contiguous; fake tensors are tensor-subclass-like, so C++ "
               "adds out of place there, an output-sized block more",
               "aten/src/ATen/native/Linear.cpp: linear, _flatten_nd_linear",
               checked=(), ran=FAKE_GPU, cases=("test_fxmem_adds_a_linears_bias_in_place",)),
    KernelRule("embedding", "workspace",
               "indices of more than one dim that cannot be viewed flat (expanded ones) are "
               "copied by indices.reshape(-1) before the output, freed as the op returns",
               "aten/src/ATen/native/Embedding.cpp: embedding_symint",
               checked=(), ran=FAKE_GPU,
               cases=("test_fxmem_copies_expanded_embedding_indices_first",)),
    KernelRule("scaled_dot_product_attention", "route",
               "CUDA's backend choice (flash, memory-efficient, cuDNN, math) for the installed "
               "release and the target's compute capability, then that backend's kernel: no "
               "B·H·L² probabilities or dropout mask for the fused ones",
               "aten/src/ATen/native/transformers/attention.cpp: scaled_dot_product_attention; "
               "aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: select_sdp_backend "
               "(fxmem/trace/kernels/cuda/sdpa.py)",
               checked=SDPA_CHECKED_ON,
               ran=FAKE_GPU, cases=("test_every_case_picks_the_backend_pytorch_picks",
                                    "test_attention_step_memory_is_exact")),
    KernelRule("softmax.int, log_softmax.int", "route",
               "a float16 input asked for float32 runs _softmax(half_to_float=True): no float32 "
               "copy of the input first, a float16 gradient (CUDA autocast asks this of every "
               "float16 softmax)",
               "aten/src/ATen/native/SoftMax.cpp: softmax, log_softmax",
               checked=BOTH,
               ran=FAKE_GPU, cases=("softmax fp16 to fp32", "log_softmax fp32")),
    KernelRule("_fused_rms_norm", "stub",
               "rms_norm runs CUDA's fused kernel, which saves the input, the weight and a "
               "float32 rstd per row; the CPU decomposes it above autograd (float32 copies saved)",
               "aten/src/ATen/native/layer_norm.cpp: rms_norm_symint; "
               "aten/src/ATen/native/cuda/layer_norm_kernel.cu: _fused_rms_norm_cuda",
               checked=BOTH,
               ran=FAKE_GPU, cases=("rms_norm", "rms_norm bf16")),
    KernelRule("native_batch_norm", "outputs",
               "save_mean and save_invstd {C} in the accumulate type, in eval too (native "
               "kernel); cuDNN's are float32 in training and empty in eval",
               "aten/src/ATen/native/cuda/Normalization.cu: batch_norm_cuda; "
               "aten/src/ATen/native/cudnn/BatchNorm.cpp: cudnn_batch_norm",
               checked=BOTH,
               ran=FAKE_GPU, cases=("batch_norm 2-d (native kernel)",
                                    "batch_norm bf16 (native kernel)",
                                    "batch_norm 2-d eval-mode grads", "test_cnn_is_exact")),
    KernelRule("native_batch_norm", "unmodelled",
               "cuDNN's reserve space (kept for backward) and workspaces, when cuDNN runs",
               "aten/src/ATen/native/Normalization.cpp: _select_batch_norm_backend"),
    KernelRule("log_sigmoid_forward", "outputs",
               "the buffer is empty on CUDA (only the CPU kernel uses it)",
               "aten/src/ATen/native/cuda/Activation.cpp: log_sigmoid_forward_cuda",
               checked=BOTH,
               ran=FAKE_GPU, cases=("log_sigmoid",)),
    KernelRule("cumsum, cumprod", "workspace",
               "an input whose dtype is not the result's (bool or int32 in, int64 out) is "
               "copied to the result's dtype after the result is made, freed when the kernel "
               "returns (fxmem/trace/kernels/cuda/kernels.py _cum_cast)",
               "aten/src/ATen/native/ReduceOps.cpp: impl_func_cum_ops (read on pytorch/pytorch's "
               "main branch; shown on the binaries)",
               checked=(), ran=FAKE_GPU, cases=("cumsum of a bool mask",)),
    KernelRule("lstm, gru, rnn_tanh, rnn_relu (.input, .data); lstm_cell, gru_cell", "route",
               "cuDNN's _cudnn_rnn when use_cudnn (else matmul and the fused cells per step); "
               "the cells: _thnn_fused_lstm_cell / _thnn_fused_gru_cell "
               "(fxmem/trace/kernels/cuda/rnn.py)",
               "aten/src/ATen/native/RNN.cpp: use_cudnn, _cudnn_impl, LSTMCell, GRUCell; "
               "aten/src/ATen/native/cudnn/RNN.cpp: _cudnn_rnn",
               checked=BOTH,
               ran=FAKE_GPU, cases=("test_lstm_is_exact",)),
    KernelRule("_cudnn_rnn, _cudnn_rnn_backward", "workspace",
               "the batch_first input made time-major, backward's copies of the input and the "
               "gradients (fxmem.trace.kernels.cuda.rnn.workspace_bytes)",
               "aten/src/ATen/native/cudnn/RNN.cpp: _cudnn_rnn, _cudnn_rnn_backward_input"),
    KernelRule("_fft_r2c", "unmodelled",
               "_fft_r2c, _fft_c2c, _fft_c2r (torch.fft, stft, istft): cuFFT's work area and, "
               "when the plan cannot read the input's layout, a contiguous copy of the input, "
               "for the duration of the op: sized inside cuFFT",
               "aten/src/ATen/native/cuda/SpectralOps.cpp: _exec_fft"),
    KernelRule("_cudnn_rnn", "unmodelled",
               "the training reserve space (kept for backward), workspaces and the dropout "
               "state: sized inside cuDNN",
               "aten/src/ATen/native/cudnn/RNN.cpp: _cudnn_rnn, get_dropout_state"),
    KernelRule("_grouped_mm", "unmodelled",
               "bfloat16 on sm90/sm100: CUTLASS's grouped GEMM, with an argument buffer and "
               "CUTLASS's workspace while it runs; otherwise a loop of mm_out into the output "
               "(the output itself as on the CPU: fxmem.trace.kernels.rules.grouped_mm_meta)",
               "aten/src/ATen/native/cuda/GroupedBlas.cpp: _grouped_mm_cuda; "
               "aten/src/ATen/native/cuda/GroupMM.cu: bf16bf16_grouped_gemm_impl_sm90_sm100"),
    KernelRule("embedding_dense_backward", "workspace",
               "above 3,072 indices (or with scale_grad_by_freq): the sorted and original "
               "indices, CUB's radix-sort storage, segment offsets and the per-segment "
               "partial sums (P×D in the accumulate type, or the fused path's V×D float32 for "
               "16-bit gradients) while the kernel runs (fxmem/trace/kernels/cuda/workspaces.py)",
               "aten/src/ATen/native/cuda/Embedding.cu: embedding_dense_backward_cuda; "
               "EmbeddingBackwardKernel.cu: embedding_backward_cuda_kernel",
               checked=BOTH,
               ran=FAKE_GPU, cases=("test_embedding_backward_sorts_on_pytorchs_own_build",)),
    KernelRule("_embedding_bag, _embedding_bag_forward_only", "outputs",
               "offset2bag is {n} and bag_size offsets' size, max_indices {num_bags, D} in "
               "max mode else {0}, in the indices' dtype (the CPU's fast sum path keeps "
               "offset2bag {0})",
               "aten/src/ATen/native/cuda/EmbeddingBag.cu: _embedding_bag_cuda",
               checked=BOTH,
               ran=FAKE_GPU, cases=("embedding_bag sum", "embedding_bag max")),
    KernelRule("_embedding_bag_backward, _embedding_bag_dense_backward", "workspace",
               "sum and mean always sort the indices: embedding backward's sort-based "
               "temporaries, never its fused atomic path (int32 indices with int64 offsets "
               "promoted first); max mode has none",
               "aten/src/ATen/native/EmbeddingBag.cpp: _embedding_bag_backward_symint; "
               "aten/src/ATen/native/cuda/EmbeddingBag.cu: "
               "embedding_bag_backward_cuda_sum_avg; EmbeddingBackwardKernel.cu: "
               "embedding_backward_cuda_kernel",
               ran=FAKE_GPU, cases=("embedding_bag sum", "embedding_bag max")),
    KernelRule("index_put (accumulate), index_add_ (deterministic)", "workspace",
               "the sort-based kernel: linear indices, sorted and original indices, the "
               "expanded values, CUB's radix-sort storage (fxmem/trace/kernels/cuda/workspaces.py)",
               "aten/src/ATen/native/cuda/Indexing.cu: index_put_with_sort_kernel"),
    KernelRule("index, index_put with a boolean mask", "workspace",
               "nonzero() makes the mask int64 indices, a column per mask dim as long as its "
               "True values, held while the kernel runs (none for x[mask] = a number: "
               "masked_fill_); the count is data, taken at the mask's elements",
               "aten/src/ATen/native/IndexingUtils.h: expandTensors; TensorAdvancedIndexing"
               ".cpp: _index_put_impl_; cuda/Nonzero.cu: nonzero_cuda_out_impl"),
    KernelRule("group_norm", "route",
               "up to 2.13 the input is made contiguous before native_group_norm, which "
               "saves it: a channels_last input is copied and the copy kept for backward "
               "(the CPU keeps channels_last, no copy); from 2.14 the input is passed as it "
               "is (native_group_norm's own copy is its workspace, the input saved)",
               "aten/src/ATen/native/group_norm.cpp: group_norm",
               checked=("2.11", "2.13", "2.15"),
               ran=FAKE_GPU, cases=("group_norm channels_last",)),
    KernelRule("native_group_norm, native_group_norm_backward", "outputs",
               "Y and dX are contiguous (the meta kernel keeps X's memory format); 2.15's "
               "channels-last kernels keep a channels_last X's format",
               "aten/src/ATen/native/group_norm.cpp: native_group_norm, "
               "native_group_norm_backward",
               ran=FAKE_GPU, cases=("group_norm", "group_norm channels_last",
                                    "group_norm channels_last bf16")),
    KernelRule("native_group_norm, native_group_norm_backward", "workspace",
               "{N, C} and {N, G} temporaries in the accumulate type; copies of a "
               "non-contiguous X and dY (2.15, a channels_last X: none of X, dY made "
               "channels_last, no {N, G, D} c1)",
               "aten/src/ATen/native/cuda/group_norm_kernel.cu; "
               "aten/src/ATen/native/group_norm.cpp",
               ran=FAKE_GPU, cases=("group_norm", "group_norm channels_last",
                                    "group_norm channels_last, no affine",
                                    "group_norm channels_last, a contiguous gradient")),
    KernelRule("_softmax_backward_data", "workspace",
               "tmp = grad_output * output, the size of the gradient (float32 in the "
               "half_to_float backward), while the kernel runs; copies of non-contiguous "
               "inputs in _softmax, _log_softmax and their backward "
               "(fxmem/trace/kernels/cuda/workspaces.py)",
               "aten/src/ATen/native/cuda/SoftMax.cu: softmax_backward_cuda_out, host_softmax, "
               "host_softmax_backward (the calls also read off the 2.11 and 2.14 cu130 "
               "binaries)",
               checked=("2.11", "2.13", "2.14"),
               ran=FAKE_GPU, cases=("softmax of a transpose", "log_softmax fp32",
                                    "softmax fp16 to fp32")),
    KernelRule("native_layer_norm_backward, _fused_rms_norm_backward", "workspace",
               "above 65,536 rows with few columns, per-block partial sums for the weight "
               "gradients; dY made contiguous",
               "aten/src/ATen/native/cuda/layer_norm_kernel.cu: "
               "LaunchGammaBetaBackwardCUDAKernel",
               checked=BOTH,
               ran=FAKE_GPU, cases=("layer_norm many rows", "rms_norm many rows")),
    KernelRule("native_layer_norm_backward", "outputs",
               "dX is contiguous (the fake kernel gives it dY's strides)",
               "aten/src/ATen/native/cuda/layer_norm_kernel.cu: layer_norm_backward_cuda",
               ran=FAKE_GPU, cases=("layer_norm fp16", "layer_norm many rows")),
    KernelRule("native_layer_norm", "outputs",
               "mean and rstd in the accumulate type (float32 for float16 and bfloat16 "
               "inputs); the CPU kernel keeps the input's dtype",
               "aten/src/ATen/native/cuda/layer_norm_kernel.cu: layer_norm_cuda",
               checked=BOTH,
               ran=FAKE_GPU, cases=("layer_norm fp16",)),
    KernelRule("_scaled_dot_product_efficient_attention", "host",
               "with dropout, the philox seed and offset (outputs 2 and 3) are host tensors "
               "outside CUDA-graph capture: no device memory (fxmem.trace.kernels.cuda.sdpa_memory."
               "HOST_OUTPUTS); at dropout 0, two empty CUDA tensors; "
               "flash's "
               "rng_state and cuDNN's seed and offset are CUDA tensors",
               "aten/src/ATen/native/transformers/cuda/attention.cu: "
               "_efficient_attention_forward (Note [Seed and Offset Device])",
               checked=SDPA_CHECKED_ON,
               ran=FAKE_GPU, cases=("test_attention_step_memory_is_exact",)),
    KernelRule("_scaled_dot_product_flash_attention, _scaled_dot_product_cudnn_attention",
               "outputs",
               "flash's rng_state (2 uint64) and its unused scalar, cuDNN's seed and offset are "
               "CUDA tensors; cuDNN's logsumexp exists only when it is needed for backward "
               "(the meta kernels say otherwise: "
               "fxmem.trace.kernels.cuda.sdpa_memory.META_CORRECTIONS)",
               "aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp: mha_fwd; "
               "attention.cu: _cudnn_attention_forward",
               checked=SDPA_CHECKED_ON,
               ran=FAKE_GPU, cases=("test_attention_step_memory_is_exact",)),
    KernelRule("_scaled_dot_product_flash_attention(_backward), "
               "_scaled_dot_product_efficient_attention(_backward), "
               "_scaled_dot_product_cudnn_attention_backward", "workspace",
               "temporaries the fused attention kernels allocate through the caching "
               "allocator while they run: flash backward's softmax_d and dq_accum, efficient "
               "backward's delta and kernel workspace, ... "
               "(fxmem.trace.kernels.cuda.sdpa_memory.WORKSPACES, "
               "workspace_bytes); cuDNN's own graph workspace is sized inside cuDNN",
               "aten/src/ATen/native/transformers/cuda/attention_backward.cu; "
               "flash_api.cpp: mha_bwd; mem_eff_attention/kernel_backward.h: workspace_size",
               checked=SDPA_CHECKED_ON,
               ran=FAKE_GPU, cases=("test_attention_step_memory_is_exact",)),
    KernelRule("native_batch_norm_backward", "workspace",
               "the native kernel on the channels-last layout (a 2-d {N, C} input, a "
               "channels_last one), or without the input's gradient: sum_dy and sum_dy_xmu, "
               "{C} in the accumulate type, while it runs (fxmem/trace/kernels/cuda/workspaces.py)",
               "aten/src/ATen/native/cuda/Normalization.cu: batch_norm_backward_cuda, "
               "batch_norm_backward_reduce_cuda; Normalization.cuh: "
               "batch_norm_use_channels_last_kernels (read from memory of the source, "
               "confirmed on the binaries)", checked=(),
               ran=FAKE_GPU, cases=("batch_norm 2-d (native kernel)",
                                    "batch_norm 2-d eval-mode grads",
                                    "batch_norm bf16 channels_last (native kernel)",
                                    "batch_norm 3-d {N, C, 1} (native kernel)")),
    KernelRule("mm, addmm, bmm, baddbmm, addbmm, mv, addmv, dot, vdot, _addmm_activation",
               "workspace",
               "up to 2.14 one cuBLAS workspace per thread, kept from its first matmul "
               "(cuBLASLt shares it); from 2.15 every call takes its own and frees it: "
               "32 MiB (sm90) through cuBLAS, CUBLASLT_WORKSPACE_SIZE KiB (1 MiB) through "
               "cuBLASLt, which addmm with a {N} bias (nn.Linear) runs "
               "(fxmem/trace/kernels/cuda/blas.py, fxmem/device/allocator.py)",
               "aten/src/ATen/cuda/CublasHandlePool.cpp: parseChosenWorkspaceSize, "
               "getCurrentCUDABlasHandle; aten/src/ATen/native/cuda/Blas.cpp: "
               "addmm_out_cuda_impl (2.15's choice seen on its binary)",
               ran=FAKE_GPU, cases=("test_every_matmul_takes_the_workspace_fxmem_says",
                                    "test_mlp_is_exact_on_the_fake_gpu")),
)
