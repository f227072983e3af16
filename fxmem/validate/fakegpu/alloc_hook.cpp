// fakegpu allocation hook: every block PyTorch's caching allocator hands out reads as zero
// until the host writes it, whatever the block held before (see stub.c,
// fakegpu_block_allocated). Loaded by _child.py with ctypes after CUDA's lazy init and
// before the first allocation; fakegpu_attach() adds a trace tracker to the allocator
// (c10/cuda/CUDACachingAllocator.h attachAllocatorTraceTracker), which the allocator calls
// with each allocation's address and size, under its lock, with no Python involved.
#include <c10/cuda/CUDACachingAllocator.h>
#include <dlfcn.h>

#include <cstddef>
#include <cstdint>

using c10::CachingDeviceAllocator::TraceEntry;

extern "C" int fakegpu_attach() {
    using zero_fn = void (*)(uintptr_t, size_t);
    auto zero = reinterpret_cast<zero_fn>(dlsym(RTLD_DEFAULT, "fakegpu_block_zero"));
    if (zero == nullptr) return 0;
    c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker([zero](const TraceEntry& te) {
        if (te.action_ == TraceEntry::ALLOC) zero(static_cast<uintptr_t>(te.addr_), te.size_);
    });
    return 1;
}
