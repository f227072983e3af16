"""Random allocation programs for tests/test_fake_gpu.py: run on PyTorch's own caching
allocator (the fake GPU: ``torch.empty`` of uint8 and ``del``, ``torch.cuda.empty_cache``)
and on fxmem's transcription of it (fxmem.device.caching_allocator)."""

import random

MiB = 2**20


def program(seed, n=1500):
    """Events of ``fxmem.device.caching_allocator.replay``: a mix of small (< 1 MiB), medium
    and large (up to 200 MiB) requests, frees of random live ones, an empty_cache now and
    then, on two streams."""
    rng = random.Random(seed)
    live, events, key = [], [], 0
    for _ in range(n):
        r = rng.random()
        if r < 0.5 or not live:
            kind = rng.random()
            size = (rng.randint(1, MiB) if kind < 0.6 else rng.randint(MiB, 30 * MiB)
                    if kind < 0.9 else rng.randint(30 * MiB, 200 * MiB))
            stream = 1 if rng.random() < 0.1 else 0
            events.append(("alloc", key, size, stream))
            live.append(key)
            key += 1
        elif r < 0.97:
            events.append(("free", live.pop(rng.randrange(len(live)))))
        else:
            events.append(("empty_cache",))
    return events


def run(seeds, n=1500):
    """Each seed's program on the real allocator, one after the other (an empty_cache
    between them): (allocated, reserved, max_allocated, max_reserved) after each event."""
    import torch

    runs = []
    for seed in seeds:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        runs.append(_run(seed, n))
    return runs


def _run(seed, n):
    import torch

    side = torch.cuda.Stream()
    live, out = {}, []
    for ev in program(seed, n):
        if ev[0] == "alloc":
            with torch.cuda.stream(side if ev[3] else torch.cuda.current_stream()):
                live[ev[1]] = torch.empty(ev[2], dtype=torch.uint8, device="cuda")
        elif ev[0] == "free":
            del live[ev[1]]
        else:
            torch.cuda.empty_cache()
        out.append((torch.cuda.memory_allocated(), torch.cuda.memory_reserved(),
                    torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()))
    return out


def run_limited(seed, fraction, n=1500):
    """The program under ``torch.cuda.set_per_process_memory_fraction(fraction)``: an
    allocation the allocator refuses (after freeing its cache and retrying) is skipped and
    marked; returns the allowed bytes and, per event, the counters and whether it failed."""
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(fraction)
    side = torch.cuda.Stream()
    live, out = {}, []
    for ev in program(seed, n):
        failed = False
        if ev[0] == "alloc":
            try:
                with torch.cuda.stream(side if ev[3] else torch.cuda.current_stream()):
                    live[ev[1]] = torch.empty(ev[2], dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError:
                failed = True
        elif ev[0] == "free":
            live.pop(ev[1], None)
        else:
            torch.cuda.empty_cache()
        out.append((torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), failed))
    return {"allowed": int(fraction * total),
            "retries": torch.cuda.memory_stats()["num_alloc_retries"], "events": out}
