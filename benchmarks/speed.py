"""How fast is fxmem? GPT-2 small, one training step, against PyTorch's own MemTracker.

    python benchmarks/speed.py [--batch 8] [--seq 512] [--repeat 3] [--depths 12,24,48]

fxmem: the whole symbolic analysis (trace on fake tensors with symbolic B, storage graph,
liveness, peak envelope) of transformers' default GPT2Config (124M parameters) built on the
meta device, sequence length 512, Adam (foreach, as CUDA runs it), ``device="cuda"``.
Peer: ``torch.distributed._tools.mem_tracker.MemTracker`` under ``FakeTensorMode`` for the
single point (B, L): one step of the same model and optimizer (the peer cannot trace fake
CUDA tensors on a CPU build, so its tensors are CPU fakes). Both run in this process, fxmem
first; resident memory is the process's peak RSS after each part. Also reported: evaluating
the formula at a new B and solving the largest B for a budget; the analysis symbolic in B
and the sequence length L (``dims``); the analysis with every block traced
(``reuse_blocks=False``); and the analysis time of GPT-2 configs 12, 24 and 48 layers deep.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from zoo import gpt2  # noqa: E402


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_fxmem(batch, seq, repeat):
    import fxmem

    with torch.device("meta"):
        model = gpt2()
    ids = torch.zeros((batch, seq), dtype=torch.long, device="meta")
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        report = fxmem.analyze(model, (ids, ids), optimizer=torch.optim.Adam, device="cuda")
        times.append(time.perf_counter() - t0)
    n = 10_000  # from where the formulas hold (below it, each B is a trace of its own)
    lo = report.min_batch_size
    t0 = time.perf_counter()
    for b in range(lo, lo + n):
        report.peak_bytes(b)
    eval_us = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    max_b = report.max_batch_size(80 * 2**30)
    solve_ms = (time.perf_counter() - t0) * 1e3
    return report, times, eval_us, max_b, solve_ms


def time_fxmem(batch, seq, repeat, n_layer=12, **kw):
    """Median seconds of ``fxmem.analyze`` and the peak formula (``repeat`` runs after one
    warm-up run)."""
    import fxmem

    with torch.device("meta"):
        model = gpt2(n_layer=n_layer)
    ids = torch.zeros((batch, seq), dtype=torch.long, device="meta")
    times = []
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        fxmem.analyze(model, (ids, ids), optimizer=torch.optim.Adam, device="cuda", **kw).peak
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def memtracker_step(model, opt, loss) -> tuple:
    """The peer: one training step (``loss()``, its backward, ``opt.step()``) under
    ``torch.distributed._tools.mem_tracker.MemTracker``, which must run inside a
    ``FakeTensorMode`` holding ``model``: (seconds, the peak MemTracker reports in bytes).
    ``benchmarks/llm_scale.py`` times its peer with it too."""
    from torch.distributed._tools.mem_tracker import MemTracker

    t0 = time.perf_counter()
    mt = MemTracker()
    mt.track_external(model, opt)
    with mt:
        loss().backward()
        opt.step()
        opt.zero_grad()
    seconds = time.perf_counter() - t0
    return seconds, sum(d["Total"] for d in mt.get_tracker_snapshot("peak").values())


def run_peer(batch, seq, repeat):
    from torch._subclasses.fake_tensor import FakeTensorMode

    times, total = [], None
    for _ in range(repeat):
        with FakeTensorMode():
            model = gpt2()
            opt = torch.optim.Adam(model.parameters(), foreach=True)
            ids = torch.zeros((batch, seq), dtype=torch.long)
            seconds, total = memtracker_step(model, opt, lambda: model(ids, ids).loss)
            times.append(seconds)
    return times, total


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--depths", default="12,24,48", help="GPT-2 depths for the scaling line")
    args = ap.parse_args(argv)
    import transformers

    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"Python {platform.python_version()}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    print(f"GPT-2 small (124M), sequence {args.seq}, Adam, B={args.batch}\n")

    report, t_fx, eval_us, max_b, solve_ms = run_fxmem(args.batch, args.seq, args.repeat)
    rss_fx = rss_mib()
    t_peer, peer_peak = run_peer(args.batch, args.seq, args.repeat)
    rss_all = rss_mib()

    def fmt(ts):
        return f"first {ts[0]:.2f} s, median {statistics.median(ts):.2f} s, best {min(ts):.2f} s"

    print(f"fxmem analyze (symbolic in B):  {fmt(t_fx)}")
    print(f"MemTracker one point (B={args.batch}):  {fmt(t_peer)}")
    print(f"ratio fxmem / peer (median):    {statistics.median(t_fx) / statistics.median(t_peer):.2f}")
    print(f"peak RSS after fxmem:           {rss_fx:.0f} MiB (process, incl. torch and transformers)")
    print(f"peak RSS after the peer too:    {rss_all:.0f} MiB")
    print(f"evaluate peak_bytes(B):         {eval_us:.1f} us per new B (mean of 10,000)")
    print(f"solve max_batch_size(80 GiB):   {solve_ms:.2f} ms -> B = {max_b:,}")
    t_bl = time_fxmem(args.batch, args.seq, args.repeat, dims={"L": [(0, 1), (1, 1)]})
    print(f"fxmem analyze (symbolic in B and L, formula included): median {t_bl:.2f} s, "
          f"ratio to peer {t_bl / statistics.median(t_peer):.2f}")
    t_full = time_fxmem(args.batch, args.seq, 1, reuse_blocks=False)
    print(f"fxmem analyze, every block traced (reuse_blocks=False): {t_full:.2f} s")
    depths = [int(d) for d in args.depths.split(",") if d]
    if depths:
        ts = {d: time_fxmem(args.batch, args.seq, args.repeat, n_layer=d) for d in depths}
        base = depths[0]
        print("analysis time by depth:         " + ", ".join(
            f"{d} layers {t:.2f} s ({t / ts[base]:.2f}x, depth {d / base:.0f}x)"
            for d, t in ts.items()))
    print(f"\nfxmem peak formula: {report.peak} bytes")
    print(f"fxmem peak at B={args.batch} (CUDA blocks): {report.peak_bytes(args.batch):,} bytes")
    print(f"MemTracker peak at B={args.batch} (CPU fakes): {peer_peak:,} bytes")


if __name__ == "__main__":
    main()
