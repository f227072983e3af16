"""Where a CLI command's time goes, process by process: the command run in this Python with
its main stages timed (a trace, FSDP2's initialisation, a planner's build, a walk over
candidate plans, each way out fit searches, the world-size search's steps), every process
it forks included, then the stages listed by process and start.

    python benchmarks/timeline.py [--out FILE] -- analyze hf:llama-3.1-8b --optimizer adamw \\
        --amp bf16 --batch 2 --seq 8192 --gpu H100-80GB --fsdp 8

Each line: ``pid start end seconds stage``, seconds since this script began (its imports
included, as a command's wall time includes them). A stage that no longer exists is left
out (the list names functions by module; see :data:`STAGES`). The timing wrappers cost
little next to these stages (each is tenths of a second or more), but the command's own
output still goes where it goes (``--format json`` keeps the timeline apart from it).
The figures in docs/benchmarks.md's "where the time goes" come from this script or its
earlier form (/work/notes/timed.py in the sessions' notes).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
import tempfile
import time

T0 = time.perf_counter()

# module -> functions timed (each replaced wherever an fxmem module holds it)
STAGES = {
    "fxmem.trace.engine.tracer": ["trace"],
    "fxmem.trace.parallel.fsdp": ["initialise"],
    "fxmem.trace.parallel.other_ranks": ["at_world_size"],
    "fxmem.checkpoint.on_device": ["walk"],
    "fxmem.checkpoint.confirm": ["plan_for", "max_batch_size"],
    "fxmem.report.fit": ["fit", "_largest_batch", "_plan_at", "fewest_ranks",
                         "param_dtype_way", "_longest"],
    "fxmem.report.world_size": ["smallest_plan", "cheapest_plan", "_plan_floor", "_guess"],
    "fxmem.report.ahead": ["param_dtype_ahead"],
    "fxmem.report.ranks_ahead": ["fewest_early"],
    "fxmem.cli.targets": ["longest_rows"],
    "fxmem.report.summary": ["summarize"],
}
# "module:Class" -> methods timed
METHODS = {
    "fxmem.checkpoint.options:Planner": ["__init__"],
    "fxmem.report.result:Report": ["runs_on_device", "with_plan", "at", "max_length"],
}


def _timed(name: str, f, out: str):
    @functools.wraps(f)
    def run(*args, **kwargs):
        t = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            e = time.perf_counter()
            with open(out, "a") as fh:  # one line per call, from whichever process
                fh.write(f"{os.getpid()} {t - T0:.2f} {e - T0:.2f} {e - t:.2f} {name}\n")
    return run


def install(out: str) -> list:
    """The stages timed into ``out``; the names of those found."""
    found = []
    for mod, names in STAGES.items():
        m = importlib.import_module(mod)
        for n in names:
            orig = getattr(m, n, None)
            if orig is None:
                continue
            new = _timed(f"{mod.rsplit('.', 1)[-1]}.{n}", orig, out)
            for held in list(sys.modules.values()):  # every fxmem module that imported it
                if getattr(held, "__name__", "").startswith("fxmem"):
                    for k, v in list(vars(held).items()):
                        if v is orig:
                            setattr(held, k, new)
            found.append(f"{mod}.{n}")
    for spec, names in METHODS.items():
        mod, cls = spec.split(":")
        c = getattr(importlib.import_module(mod), cls, None)
        for n in names if c is not None else ():
            if n in vars(c):
                setattr(c, n, _timed(f"{cls}.{n}", vars(c)[n], out))
                found.append(f"{spec}.{n}")
    return found


def table(out: str) -> str:
    """The lines of ``out`` by process (first to start first), then by start."""
    rows = [line.split(maxsplit=4) for line in open(out).read().splitlines() if line.strip()]
    first: dict = {}
    for pid, start, *_ in rows:
        first[pid] = min(first.get(pid, float("inf")), float(start))
    rows.sort(key=lambda r: (first[r[0]], float(r[1]), -float(r[3])))
    return "\n".join(f"{pid:>7} {float(s):7.2f} {float(e):7.2f} {float(d):6.2f}  {name}"
                     for pid, s, e, d, name in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="the timeline's file (default: a temporary one)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then fxmem's arguments")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    out = args.out or tempfile.mkstemp(prefix="fxmem-timeline-", suffix=".txt")[1]
    open(out, "w").close()
    from fxmem.cli import main as fxmem  # the CLI's modules, before their functions are timed

    install(out)
    sys.argv = ["fxmem", *command]
    code = 0
    try:
        fxmem()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    print(f"# pid start end seconds stage (seconds since the script began; {out})",
          file=sys.stderr)
    print(table(out), file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
