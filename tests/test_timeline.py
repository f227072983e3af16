"""benchmarks/timeline.py, the per-process timeline of a CLI command that docs/benchmarks.md's
"where the time goes" figures come from: it runs the command as the CLI does (the same exit
code and report), times the stages it names, and lists them by process."""

import json
import subprocess
import sys

from test_cli import ROOT, SEED, run


def test_the_command_runs_as_it_does_alone_with_its_stages_timed(tmp_path):
    out = tmp_path / "timeline.txt"
    args = ["analyze", *SEED, "--budget", "4MiB", "--format", "json"]  # over: ways searched
    r = subprocess.run([sys.executable, "benchmarks/timeline.py", "--out", str(out), "--",
                        *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    alone = run(*args, module=True)
    assert r.returncode == alone.returncode == 4, r.stderr[-2000:]
    assert json.loads(r.stdout)["fit"] == json.loads(alone.stdout)["fit"]
    rows = [line.split() for line in out.read_text().splitlines()]
    stages = {row[4] for row in rows}
    assert {"tracer.trace", "fit.fit", "fit._largest_batch"} <= stages
    for pid, start, end, seconds, _ in rows:
        assert 0 <= float(start) <= float(end) and float(seconds) >= 0
    listed = [line for line in r.stderr.splitlines() if "tracer.trace" in line]
    assert listed and all(line.split()[0].isdigit() for line in listed)
