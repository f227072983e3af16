"""The real-model zoo (tests/realmodels): every case predicted and measured, written to
docs/real-models.md and docs/real-models.json.

    python benchmarks/realmodels.py [--only SUBSTR,...] [--jobs N] [--timeout S] [--held-out]

Each case runs in its own Python process (a crash, a hang or a model's memory stays there):
``fxmem.analyze`` traces its training step with Adam at B=4 on the CPU, ``fxmem.measure``
runs the real step at B=2 and B=5 (and ``tests/witness.py``, which shares no code with fxmem,
witnesses each of those steps: the page counts where ``measure`` equals it), and the row says
``exact``, the error at each batch size,
or ``refused`` with fxmem's one-line message. ``--only`` keeps the cases whose name contains
one of the comma-separated strings; their rows replace the same rows of the existing JSON,
so a partial run updates the table instead of shrinking it (``--fresh``: start from nothing).
``--held-out`` audits the held-out sample instead (tests/realmodels/heldout.py: models drawn
by a rule, none of the registry's) into docs/real-models-heldout.md and .json.
Needs torchvision, timm, transformers and peft (constraints-realmodels.txt).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from realmodels.audit import Result, status_text  # noqa: E402
from realmodels.registry import CASES  # noqa: E402

DOCS = os.path.join(ROOT, "docs")


def outputs(held_out: bool) -> tuple[str, str]:
    """The Markdown and JSON files a run writes."""
    stem = "real-models-heldout" if held_out else "real-models"
    return os.path.join(DOCS, stem + ".md"), os.path.join(DOCS, stem + ".json")


def run_worker(name: str, held_out: bool) -> None:
    """``--worker NAME``: audit one case in this process and print its result as JSON."""
    import warnings

    warnings.filterwarnings("ignore")
    from realmodels.audit import audit
    from realmodels.heldout import heldout_case

    case = heldout_case(name) if held_out else CASES[name]
    print("RESULT " + json.dumps(audit(case, witness=True).to_json()), flush=True)


def run_case(case, timeout: float, threads: int, held_out: bool) -> dict:
    """Audit one case in a child process; a crash or a timeout is an ``error`` row."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", case.name]
    cmd += ["--held-out"] if held_out else []
    t0 = time.perf_counter()

    def error(message):
        return Result(case.name, case.family, status="error", note=case.note,
                      message=message).to_json()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return error(f"timed out after {timeout:.0f} s")
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            row = json.loads(line[len("RESULT "):])
            row["wall_seconds"] = round(time.perf_counter() - t0, 1)
            row["note"] = row.get("note") or case.note
            return row
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    return error(f"the worker exited {p.returncode}: {tail[:200]}")


def versions() -> str:
    """The machine and library versions, one line."""
    import importlib.metadata as md

    libs = []
    for lib in ("torch", "torchvision", "timm", "transformers", "peft"):
        try:
            libs.append(f"{lib} {md.version(lib)}")
        except md.PackageNotFoundError:
            libs.append(f"{lib} (absent)")
    return (f"{', '.join(libs)}; Python {platform.python_version()}, {platform.machine()}, "
            f"{os.cpu_count()} CPU cores")


def _row(r: dict) -> Result:
    r = {k: v for k, v in r.items() if k in Result.__dataclass_fields__}
    return Result(**r)


def summary(rows: list[dict]) -> dict:
    """Counts: exact, within 1 % and 0.5 % (exact included), inexact, refused, invalid (the
    real step fails), error, total."""
    res = [_row(r) for r in rows]
    count = {s: sum(1 for r in res if r.status == s)
             for s in ("exact", "inexact", "refused", "invalid", "error")}
    measured = [r for r in res if r.points]
    count["witnessed"] = sum(1 for r in measured if r.witnessed)
    count["witness_agrees"] = sum(1 for r in measured if r.witnessed
                                  and [[b, m] for b, _, m in r.points] == r.witnessed)
    for name, tol in (("within_1pct", 0.01), ("within_half_pct", 0.005)):
        count[name] = sum(1 for r in res
                          if r.status in ("exact", "inexact") and abs(r.worst[1]) <= tol)
    return dict(count, total=len(res))


INTRO = {
    False: "Every case of the real-model zoo (`tests/realmodels/registry.py`): architectures "
           "from torchvision, timm and Hugging Face transformers with random weights and small "
           "configurations.",
    True: "The held-out audit (`tests/realmodels/heldout.py`): architectures drawn with a fixed "
          "seed by a rule from what timm, torchvision and transformers offer (one model of each "
          "sampled timm architecture file, torchvision classifiers, Hugging Face model types "
          "with their configs shrunk by one generic rule), none of them in the registry, none "
          "chosen or configured by hand.",
}


def markdown(rows: list[dict], header: dict, held_out: bool = False) -> str:
    s = summary(rows)
    valid = s["total"] - s["invalid"] - s["error"]
    out = [
        "# Real models" + (": the held-out audit" if held_out else ""),
        "",
        INTRO[held_out] + " For each, `fxmem.analyze(..., optimizer=torch.optim.Adam, "
        "device=\"cpu\")` traces one training step at B=4 and `fxmem.measure` runs the real "
        "step at B=2 and B=5; the status is `exact` when the predicted peak live bytes equal the "
        "measured ones at both, else the error (predicted - measured) at each, `refused` "
        "with fxmem's one-line message (the real step runs), or `invalid` when the real step "
        "itself fails (the case, not fxmem). The analysis time is that of `fxmem.analyze`.",
        "",
        "Commands (a later one's rows replace the earlier's): "
        + ", then ".join(f"`{c}`" for c in header["commands"]),
        "",
        f"Machine: {header['machine']}; run {header['date']}.",
        "",
        (f"**Of {valid} cases whose real step runs: {s['exact']} exact "
         f"({s['exact'] / max(valid, 1):.1%}), {s['within_half_pct']} within 0.5 % and "
         f"{s['within_1pct']} within 1 % (exact included), {s['inexact']} inexact, "
         f"{s['refused']} refused. Besides: {s['invalid']} invalid, {s['error']} errors "
         f"(crashed or timed out), of {s['total']} in all.**"),
        "",
        f"The measurements themselves: `fxmem.measure` equals the independent witness "
        f"(`tests/witness.py`, which shares no code with fxmem) at every batch size in "
        f"{s['witness_agrees']} of the {s['witnessed']} cases witnessed.",
        "",
    ]
    causes = os.path.join(DOCS, ("real-models-heldout-causes.md" if held_out
                                 else "real-models-causes.md"))
    if os.path.exists(causes):  # the hand-written diagnosis of what is short
        with open(causes, encoding="utf-8") as f:
            out += [f.read().rstrip(), ""]
    out += [
        "| model | family | params | status | analysis s | configuration |",
        "|---|---|---:|---|---:|---|",
    ]
    for r in sorted(rows, key=lambda r: r["name"]):
        res = _row(r)
        status = status_text(res).replace("|", "\\|")
        if res.witnessed and [[b, m] for b, _, m in res.points] != res.witnessed:
            status += f" (measure differs from the witness: {res.witnessed})"
        if res.unmodelled:
            status += " (not modelled: " + "; ".join(res.unmodelled).replace("|", "\\|") + ")"
        params = f"{res.params:,}"
        if res.trainable != res.params and res.params:
            params += f" ({res.trainable:,} trainable)"
        out.append(f"| {res.name.split('/', 1)[1]} | {res.family} | {params} | {status} | "
                   f"{res.seconds:.1f} | {res.note} |")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated substrings of case names")
    ap.add_argument("--jobs", type=int, default=1, help="cases run at once")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds a case may take")
    ap.add_argument("--fresh", action="store_true", help="do not merge into the existing JSON")
    ap.add_argument("--list", action="store_true", help="print the case names and stop")
    ap.add_argument("--render", action="store_true",
                    help="only rewrite the Markdown table from the existing JSON")
    ap.add_argument("--held-out", action="store_true",
                    help="audit the held-out sample (tests/realmodels/heldout.py)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return run_worker(args.worker, args.held_out)
    MD, JSON = outputs(args.held_out)
    if args.render:
        with open(JSON, encoding="utf-8") as f:
            data = json.load(f)
        with open(MD, "w", encoding="utf-8") as f:
            f.write(markdown(data["results"], data, args.held_out))
        return None
    if args.held_out:
        from realmodels.heldout import heldout_cases

        cases = heldout_cases()
    else:
        cases = CASES
    keys = [k for k in args.only.split(",") if k]
    names = [n for n in cases if not keys or any(k in n for k in keys)]
    if args.list:
        print("\n".join(names))
        return None
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    rows, commands = {}, []
    if not args.fresh and keys and os.path.exists(JSON):
        with open(JSON, encoding="utf-8") as f:
            old = json.load(f)
        rows = {r["name"]: r for r in old["results"] if r["name"] in cases}
        commands = old.get("commands") or ([old["command"]] if "command" in old else [])
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(run_case, cases[n], args.timeout, threads, args.held_out): n
                   for n in names}
        for i, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            r = fut.result()
            rows[r["name"]] = r
            print(f"[{i}/{len(names)}] {r['name']}: {status_text(_row(r))} "
                  f"({r['seconds']:.1f} s)", flush=True)
    argv_text = " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    command = f"python benchmarks/realmodels.py {argv_text}".strip()
    header = dict(commands=[*commands, command], machine=versions(),
                  date=datetime.date.today().isoformat())
    results = sorted(rows.values(), key=lambda r: r["name"])
    with open(JSON, "w", encoding="utf-8") as f:
        json.dump(dict(header, summary=summary(results), results=results), f, indent=1)
        f.write("\n")
    with open(MD, "w", encoding="utf-8") as f:
        f.write(markdown(results, header, args.held_out))
    print(json.dumps(summary(results)))
    return None


if __name__ == "__main__":
    main()
