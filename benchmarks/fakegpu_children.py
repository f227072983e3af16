"""What the fake GPU's children cost, started afresh and forked from a warm server: the
three runs of one of ``tests/test_fake_gpu_parallel.py``'s compiled cases (the inductor
cache's filling, the measured run at two batch sizes, fxmem's prediction), each timed.

    python benchmarks/fakegpu_children.py [--case fsdp-compiled]

Run it with a CUDA build of torch (the fake GPU) from the repository's root. Each way gets
a cold inductor cache of its own; the fork server is started (and timed, as "server") before
the forked runs, as a test run's first child starts it once for all. Inductor compiles in
the asking process, as ``tests/conftest.py`` has it (``TORCHINDUCTOR_COMPILE_THREADS=1``).
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")
sys.path.insert(0, TESTS)

import fakegpu_parallel_targets as targets  # noqa: E402

from fxmem.validate.fakegpu.forkserver import forkserver  # noqa: E402
from fxmem.validate.fakegpu.ranks import call_ranks  # noqa: E402
from fxmem.validate.fakegpu.run import call  # noqa: E402

BATCHES = [8, 512]  # tests/test_fake_gpu_parallel.py's COMPILED_BATCHES


def runs(name: str, forked: bool) -> dict:
    """Seconds of each run of case ``name``, in a cold cache of its own."""
    world = targets.CASES[name][1]().world_size
    took = {}
    with forkserver(enabled=forked), tempfile.TemporaryDirectory(prefix="fxmem_inductor_") as d:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=d)
        ranks = functools.partial(call_ranks, sys.executable, world_size=world,
                                  sys_path=[TESTS], env=env)
        steps = {
            "server": lambda: call(sys.executable, "fakegpu_forkserver_targets:server_pid",
                                   sys_path=[TESTS], env=env),
            "fill": lambda: ranks("fakegpu_parallel_targets:measure",
                                  kwargs={"name": name, "B": BATCHES[0]}),
            "measure": lambda: ranks("fakegpu_parallel_targets:measure_each",
                                     kwargs={"name": name, "batches": BATCHES}),
            "predict": lambda: call(sys.executable, "fakegpu_parallel_targets:predict",
                                    sys_path=[TESTS], env=env,
                                    kwargs={"name": name, "batches": BATCHES,
                                            "checkpoint": None}),
        }
        for what, run in steps.items():
            if what == "server" and not forked:
                continue
            t0 = time.perf_counter()
            run()
            took[what] = time.perf_counter() - t0
    return took


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="fsdp-compiled", choices=sorted(
        n for n in targets.CASES if "compiled" in n))
    args = ap.parse_args(argv)
    afresh, forked = runs(args.case, False), runs(args.case, True)
    print(f"| {args.case} | afresh | forked |\n| --- | --- | --- |")
    for what in ("server", "fill", "measure", "predict"):
        a = f"{afresh[what]:.1f} s" if what in afresh else ""
        print(f"| {what} | {a} | {forked[what]:.1f} s |")
    three = ("fill", "measure", "predict")
    print(f"| the three runs | {sum(afresh[w] for w in three):.1f} s | "
          f"{sum(forked[w] for w in three):.1f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
