"""LLM scale (issue 41): the fxmem command on Llama-3.1-8B and 70B against PyTorch's MemTracker.

    python benchmarks/llm_scale.py [--only NAME ...] [--timeout 900] [--skip-peer]
        [--peer-once] [--repeat N] [--log FILE]

Each row is one ``fxmem analyze`` command run in a subprocess under ``/usr/bin/time -v``:
its wall time, the child's peak resident memory ("Maximum resident set size") and its exit
code, with the first line it printed (the headline, or the error). The peer is
``torch.distributed._tools.mem_tracker.MemTracker`` under ``FakeTensorMode`` giving the
single point (B=2, L=8192) of the same step of Llama-3.1-8B (the ``hf:llama-3.1-8b``
preset's config, AdamW (foreach), bf16 autocast, the causal-LM loss), also in a subprocess
under ``/usr/bin/time -v``: ``wall`` is the whole child (imports, the model built on fake
tensors, the step), ``step`` the tracked step alone. The peer's tensors are CPU fakes (the
fake CUDA tensors a GPU build would make cannot run autograd on a CPU build). The ratio
column is each command's wall over the peer's wall.

The goals (issue 41): one GPU and ``--fsdp 8`` at most 0.5x the peer, ``--fsdp 8
--checkpoint auto`` at most 1x, the 70B ``--fsdp 64 --checkpoint auto`` at most 2x; each
at most 1.5 GB peak RSS.

Each row's peer is run right before its command (``peer`` column), and the ratio is to
that run: this machine's speed drifts within minutes (a fixed Python loop took 0.96 s and
1.92 s in one session; the peer took 31.8 s at 14:41 UTC and 49.0 s at 15:13 UTC on
2026-12-05), so a ratio to one peer run made at the start compares runs made at
different speeds. ``--peer-once``: that one run at the start, for every row (quicker).
``--repeat N``: each row N times, each run after its own peer run; the row gives the median
wall, the median peer and the median of the N ratios, with each pair (command/peer).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from statistics import median

HERE = os.path.dirname(os.path.abspath(__file__))
FXMEM = [sys.executable, "-m", "fxmem"]
BASE8 = ["analyze", "hf:llama-3.1-8b", "--optimizer", "adamw", "--amp", "bf16", "--batch", "2",
         "--seq", "8192", "--gpu", "H100-80GB"]
BASE70 = ["analyze", "hf:llama-3.1-70b", "--optimizer", "adamw", "--amp", "bf16", "--batch",
          "1", "--seq", "4096", "--gpu", "H100-80GB"]
COMMANDS = {
    "8b": BASE8,
    "8b-ckpt": BASE8 + ["--checkpoint", "auto"],
    "8b-fsdp8": BASE8 + ["--fsdp", "8"],
    "8b-fsdp8-ckpt": BASE8 + ["--fsdp", "8", "--checkpoint", "auto"],
    "70b-fsdp64-ckpt": BASE70 + ["--fsdp", "64", "--checkpoint", "auto"],
}
GOALS = {"8b": 0.5, "8b-fsdp8": 0.5, "8b-fsdp8-ckpt": 1.0, "70b-fsdp64-ckpt": 2.0}

PEER = r"""
import sys, time, torch
t0 = time.perf_counter()
from torch._subclasses.fake_tensor import FakeTensorMode
sys.path.insert(0, sys.argv[1])
from speed import memtracker_step
from fxmem.cli.families import _hf_config
cfg, model_class = _hf_config("llama-3.1-8b", {})
B, L = 2, 8192
with FakeTensorMode():
    model = model_class(cfg)
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    ids = torch.zeros((B, L), dtype=torch.long)
    t1 = time.perf_counter()

    def loss():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(input_ids=ids, labels=ids).loss
    step, peak = memtracker_step(model, opt, loss)
print(f"MemTracker peak {peak:,} bytes at B={B}, L={L}; step {step:.1f} s, "
      f"model built {t1 - t0:.1f} s")
"""

def timed(argv, timeout: float) -> dict:
    """Run ``argv`` under /usr/bin/time -v: wall seconds, peak RSS (bytes), exit code,
    stdout and stderr (time's own report taken out)."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(["/usr/bin/time", "-v", *argv], capture_output=True, text=True,
                           timeout=timeout, cwd=os.path.join(HERE, ".."))
    except subprocess.TimeoutExpired:
        return {"wall": time.perf_counter() - t0, "rss": None, "rc": "timeout", "out": "",
                "err": f"no answer within {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    err, _, timing = p.stderr.partition("\tCommand being timed:")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", timing)
    code = re.search(r"Exit status: (\d+)", timing)
    return {"wall": wall, "rss": int(rss.group(1)) * 1024 if rss else None,
            "rc": int(code.group(1)) if code else p.returncode, "out": p.stdout, "err": err}


def answer(run: dict) -> str:
    """The first line the command printed: its error, or the report's first lines."""
    text = run["err"].strip() if run["rc"] not in (0,) else run["out"].strip()
    lines = [ln.strip(" │┃") for ln in text.splitlines() if ln.strip(" │┃─━╭╮╰╯┏┓┗┛")]
    line = " ".join(lines[:1 if run["rc"] else 3])
    return line[:240] + (" ..." if len(line) > 240 else "")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(COMMANDS), help="rows to run")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per command")
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--peer-once", action="store_true",
                    help="one peer run at the start for every row, not one before each")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of each row (each after its own peer run): the medians")
    ap.add_argument("--log", help="write every command's whole output to this file")
    args = ap.parse_args(argv)
    import torch

    print(f"<!-- python benchmarks/llm_scale.py; {platform.machine()}, {os.cpu_count()} "
          f"CPUs, Python {platform.python_version()}, torch {torch.__version__}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} -->")
    peer = None

    def run_peer():
        got = timed([sys.executable, "-c", PEER, HERE], args.timeout)
        print(f"peer: MemTracker, Llama-3.1-8B B=2 L=8192: wall {got['wall']:.1f} s, "
              f"max RSS {got['rss'] / 1e9:.2f} GB, exit {got['rc']}: "
              f"{(got['out'] or got['err']).strip()[-300:]}", flush=True)
        return got
    if not args.skip_peer and args.peer_once:
        peer = run_peer()
    rows = []
    log = open(args.log, "w") if args.log else None
    for name in args.only or COMMANDS:
        cmd = COMMANDS[name]
        pairs = []  # (the command's run, the peer's run before it)
        for _ in range(args.repeat):
            if not args.skip_peer and not args.peer_once:
                peer = run_peer()  # just before the command: the machine at the same speed
            run = timed([*FXMEM, *cmd], args.timeout)
            pairs.append((run, peer))
            if log:
                log.write(f"=== {' '.join(cmd)}\n--- stdout\n{run['out']}\n--- stderr\n"
                          f"{run['err']}\n")
                log.flush()
        run = pairs[0][0]
        walls = [r["wall"] for r, _ in pairs]
        ratios = [r["wall"] / p["wall"] for r, p in pairs if p is not None and p["rc"] == 0]
        ratio = f"{median(ratios):.2f}" if ratios else ""
        goal = f" (≤ {GOALS[name]})" if name in GOALS and ratio else ""
        rss = max((r["rss"] for r, _ in pairs if r["rss"]), default=None)
        rss = f"{rss / 1e9:.2f} GB" if rss else "?"
        shown = " ".join(cmd[1:])
        against = "" if pairs[0][1] is None else \
            f"{median(p['wall'] for _, p in pairs if p is not None):.1f} s"
        each = "" if len(pairs) == 1 else " (" + ", ".join(
            f"{w:.1f}/{p['wall']:.1f}" for w, (_, p) in zip(walls, pairs) if p is not None) + ")"
        rows.append(f"| `fxmem analyze {shown}` | {median(walls):.1f} s{each} | {rss} | "
                    f"{run['rc']} | {against} | {ratio}{goal} | {answer(run)} |")
    if log:
        log.close()
    print("\n| command | wall | max RSS | exit | peer | ratio to peer (goal) | answer |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    print("\n".join(rows), flush=True)


if __name__ == "__main__":
    main()
