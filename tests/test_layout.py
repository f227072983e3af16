"""The package layout (docs/architecture.md): one folder per stage, imports only flowing down,
no import cycles, no module past 600 lines.

Every import counts, the ones inside functions too: a lazy import that reaches up a layer is
a cycle waiting for its first module-level use."""

import ast
from pathlib import Path

import networkx as nx
import pytest

import fxmem

ROOT = Path(fxmem.__file__).resolve().parent

# bottom to top: a module may import its own layer and the ones below, never above
LAYERS = (
    {"errors"},
    {"formula"},  # symbols, exact polynomials, guards, proofs over B and the dims
    {"trace"},  # the step on fake tensors (and what CUDA's kernels do)
    {"memory"},  # the graph, device sizes, liveness
    {"device"},  # the caching allocator and what the device adds
    {"checkpoint"},  # segments, schedules, the solver, the chooser, FLOPs
    {"report"},  # the Report and its renderers
    {"analyze", "whatif"},  # the pipeline in one call
    {"validate"},  # ground truth: measure, the zoo, the harness
    {"integrations"},  # the Hugging Face Trainer, accelerate (imported only when used)
    {"cli"},  # the command
)
MAX_LINES = 600
MAX_FUNCTION_LINES, MAX_CLASS_LINES = 120, 300  # in fxmem/trace/
# fxmem/trace/'s rooms, bottom to top (docs/architecture.md): the same rule inside the stage
TRACE_ROOMS = (
    "ledger",  # what a trace records: ops, storages, saved tensors, the tracking mode
    "kernels",  # what eager kernels do that fake ones do not (CPU's and CUDA's)
    "compiled",  # torch.compile'd models: inductor's code run on the fakes
    "plans",  # checkpoint plans as data, installed on a model
    "parallel",  # one rank of FSDP2, DDP, TP, and a model the user wrapped
    "blocks",  # repeated blocks traced as two, the rest copied
    "engine",  # the step, the tracer, the recorder, the finished trace
)


def _modules() -> dict:
    """dotted name -> path, for every module of the package."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set:
    """The fxmem modules ``name`` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in MODULES:
                    found.add(f"{target}.{alias.name}")
                elif target in MODULES:
                    found.add(target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in MODULES)
    found.discard(name)
    return found


def _layer(name: str) -> int | None:
    """The layer of a module; None for the package's top (``fxmem``) and entry points."""
    parts = name.split(".")
    if len(parts) == 1 or parts[-1] == "__main__":
        return None
    for i, members in enumerate(LAYERS):
        if parts[1] in members:
            return i
    raise AssertionError(f"{name} is in no layer: add its folder to LAYERS and "
                         "docs/architecture.md")


GRAPH = nx.DiGraph([(m, t) for m, p in MODULES.items() for t in _imports(m, p)])
GRAPH.add_nodes_from(MODULES)


def test_every_module_has_a_layer():
    for name in MODULES:
        _layer(name)


def test_no_import_cycles():
    cycles = [c for c in nx.simple_cycles(GRAPH)]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c + c[:1]) for c in cycles)


def test_imports_only_flow_down():
    upward = []
    for m, t in GRAPH.edges:
        lm, lt = _layer(m), _layer(t)
        if lm is not None and lt is not None and lt > lm:
            upward.append(f"{m} -> {t}")
    assert not upward, "imports reaching up a layer: " + ", ".join(sorted(upward))


def _room(name: str) -> int | None:
    """The room of a module of ``fxmem.trace`` (None for the stage's own ``__init__``)."""
    parts = name.split(".")
    if parts[:2] != ["fxmem", "trace"] or len(parts) == 2:
        return None
    assert parts[2] in TRACE_ROOMS, f"{name} is in no room of fxmem.trace: add it to " \
        "TRACE_ROOMS and docs/architecture.md"
    return TRACE_ROOMS.index(parts[2])


def test_trace_rooms_import_only_rooms_below():
    upward = [f"{m} -> {t}" for m, t in GRAPH.edges
              if _room(m) is not None and _room(t) is not None and _room(t) > _room(m)]
    assert not upward, "fxmem.trace rooms reaching up: " + ", ".join(sorted(upward))


def test_other_stages_enter_trace_by_its_faces():
    """Outside ``fxmem.trace``, a room is imported by its face (``fxmem.trace.parallel``,
    its ``__init__``), not its modules; CUDA's kernel modules (``fxmem.trace.kernels.cuda``)
    are read one by one by the device stage's allocator replay."""
    inside = [f"{m} -> {t}" for m, t in GRAPH.edges
              if not m.startswith("fxmem.trace") and t.startswith("fxmem.trace.")
              and len(t.split(".")) > 3 and not t.startswith("fxmem.trace.kernels.cuda.")]
    assert not inside, "imports past a room's face: " + ", ".join(sorted(inside))


def test_trace_has_no_loose_modules():
    loose = [m for m in MODULES if m.startswith("fxmem.trace.") and len(m.split(".")) == 3
             and m.split(".")[2] not in TRACE_ROOMS]
    assert not loose, f"modules of fxmem.trace outside its rooms: {loose}"


def test_trace_bodies_read_as_steps():
    """In ``fxmem.trace``, no function over 120 lines and no class over 300 (docstrings
    included): a longer body is broken into named steps (issue 38)."""
    long = []
    for name, path in MODULES.items():
        if not name.startswith("fxmem.trace"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > (MAX_CLASS_LINES if isinstance(node, ast.ClassDef)
                            else MAX_FUNCTION_LINES):
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert not long, "long bodies in fxmem.trace: " + ", ".join(sorted(long))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_size(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines (split it by concern)"


def test_the_checker_sees_a_cycle_and_an_upward_import():
    """The checks above are not vacuous: the graph they walk has the edges they forbid."""
    assert GRAPH.has_edge("fxmem.memory.liveness", "fxmem.memory.sizes")
    assert GRAPH.has_edge("fxmem.cli.command", "fxmem.validate.harness")
    g = GRAPH.copy()
    g.add_edge("fxmem.memory.sizes", "fxmem.memory.liveness")
    assert list(nx.simple_cycles(g))
    assert _layer("fxmem.memory.sizes") < _layer("fxmem.validate.harness")
    assert GRAPH.has_edge("fxmem.trace.engine.tracer", "fxmem.trace.blocks.splice")
    assert _room("fxmem.trace.blocks.splice") > _room("fxmem.trace.ledger.records")
