"""The source tree shows the architecture: native/ in layers whose includes only go
down, a facade without import cycles, and files of a readable size."""
import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "native"
PACKAGE = ROOT / "collectives"

# Bottom to top; a file may include headers of its own layer and of the layers
# before it. coll.h, the API and its types, is spoken by every layer. jax/ is
# glue compiled apart against the API alone.
LAYERS = ["coll.h", "base", "reduce", "cuda", "transport", "schedule", "algorithms", "comm"]
SIDE = {"jax": ["coll.h"]}
SOURCE_SUFFIXES = {".c", ".h", ".cc", ".cu", ".pyx", ".pxi", ".pxd"}
MAX_LINES = 850  # STYLE: files stay under ~800 lines


def _layer_of(rel: Path) -> str:
    return rel.parts[0] if len(rel.parts) > 1 else rel.name


def _native_files():
    return sorted(p for p in NATIVE.rglob("*") if p.suffix in SOURCE_SUFFIXES
                  and p.name != "_core.c")  # Cython's output


def test_native_is_in_layer_folders():
    top = {p.name for p in NATIVE.iterdir() if not p.name.startswith(".")}
    loose = sorted(n for n in top if n not in LAYERS and n not in SIDE and n != "README.md"
                   and n != "_core.c")
    assert not loose, f"native/ files outside a layer folder: {loose}"
    for layer in LAYERS[1:] + list(SIDE):
        assert (NATIVE / layer).is_dir(), f"native/{layer}/ is missing"


def test_native_includes_only_go_down():
    wrong = []
    for path in _native_files():
        rel = path.relative_to(NATIVE)
        layer = _layer_of(rel)
        allowed = SIDE.get(layer) or LAYERS[:LAYERS.index(layer) + 1]
        text = path.read_text()
        # C includes, and the headers Cython's extern blocks name.
        for target in re.findall(r'#\s*include\s+"([^"]+)"', text) + \
                re.findall(r'cdef extern from "([^"]+)"', text):
            if target.startswith("xla/"):  # jaxlib's FFI headers
                continue
            if not (NATIVE / target).is_file():
                wrong.append(f"{rel}: includes {target!r}, which is not native/{target}")
                continue
            if _layer_of(Path(target)) not in allowed:
                wrong.append(f"{rel} ({layer}) includes {target} from a layer above or beside it")
    assert not wrong, "\n".join(wrong)


def _imports(path: Path, module: str, is_package: bool, known: set) -> set:
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            # A submodule importing its own package's __init__ is no cycle of layers.
            if target and target != module and not module.startswith(target + "."):
                found.add(target)
    return found


def _facade_graph() -> dict:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    known = set(modules)
    return {m: _imports(p, m, is_pkg, known) for m, (p, is_pkg) in modules.items()}


def _cycles(graph: dict) -> list:
    found, state, stack = [], {}, []

    def visit(u):
        state[u] = "open"
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == "open":
                found.append(stack[stack.index(v):] + [v])
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = "done"

    for u in sorted(graph):
        if u not in state:
            visit(u)
    return found


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_facade_has_no_import_cycles():
    graph = _facade_graph()
    # The graph sees lazy imports too: the package's init() goes through MPI.
    assert "collectives.MPI" in graph["collectives"]
    assert "collectives.rendezvous.world" in graph["collectives.MPI"]
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_bench_is_a_subpackage_apart_from_the_library():
    assert (PACKAGE / "bench" / "__init__.py").is_file()
    assert not list(PACKAGE.glob("*bench*.py")), "benchmark modules at the top of collectives/"
    graph = _facade_graph()
    library = [m for m in graph if not m.startswith("collectives.bench")]
    users = [m for m in library if any(t.startswith("collectives.bench") for t in graph[m])]
    assert not users, f"library modules import the bench: {users}"


def test_files_stay_readable():
    long = []
    for path in list(PACKAGE.rglob("*.py")) + _native_files():
        n = path.read_text().count("\n")
        if n > MAX_LINES:
            long.append(f"{path.relative_to(ROOT)}: {n} lines")
    assert not long, f"files over {MAX_LINES} lines (split by concept): {long}"


# The Python packages mirror the layers (DESIGN.md), bottom to top. A module
# may import its own layer and the layers below it; the package's __init__
# (init, finalize, shrink) is the facade over the front ends.
PY_LAYERS = [
    ("core", ["collectives._core"]),
    ("rendezvous", ["collectives.rendezvous", "collectives.config"]),
    ("elastic", ["collectives.elastic"]),
    ("front ends", ["collectives", "collectives.MPI", "collectives.torch", "collectives.jax",
                    "collectives.ps"]),
    ("engines", ["collectives.launcher", "collectives.run", "collectives.ray",
                 "collectives.spark", "collectives.bench"]),
]
TOP_LEVEL_MODULES = {"__init__.py", "config.py", "run.py"}


def _py_layer(module: str) -> int:
    best, best_len = None, -1
    for index, (_, names) in enumerate(PY_LAYERS):
        for name in names:
            exact = name == "collectives"  # the root holds only the facade
            if (module == name or (not exact and module.startswith(name + "."))) \
                    and len(name) > best_len:
                best, best_len = index, len(name)
    return best


def _upward_imports(graph: dict) -> list:
    wrong = []
    for module, targets in sorted(graph.items()):
        mine = _py_layer(module)
        for target in sorted(targets):
            theirs = _py_layer(target)
            if theirs is not None and mine is not None and theirs > mine:
                wrong.append(f"{module} ({PY_LAYERS[mine][0]}) imports {target} "
                             f"({PY_LAYERS[theirs][0]})")
    return wrong


def test_python_layer_check_finds_an_upward_import():
    graph = {"collectives.rendezvous.world": {"collectives.MPI"},
             "collectives.MPI": {"collectives.rendezvous.world", "collectives._core"}}
    assert _upward_imports(graph) == [
        "collectives.rendezvous.world (rendezvous) imports collectives.MPI (front ends)"]


def test_python_packages_are_the_layers():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert set(top) <= TOP_LEVEL_MODULES, \
        f"modules at the top of collectives/ (put them in their layer's package): {top}"
    graph = _facade_graph()
    unplaced = sorted(m for m in graph if _py_layer(m) is None)
    assert not unplaced, f"modules in no layer (add them to PY_LAYERS): {unplaced}"
    for _, names in PY_LAYERS:
        for name in names:
            init = ROOT.joinpath(*name.split("."), "__init__.py")
            if init.is_file():
                assert ast.get_docstring(ast.parse(init.read_text())), \
                    f"{name} opens with no docstring saying what it is and may import"


def test_python_imports_only_go_down():
    wrong = _upward_imports(_facade_graph())
    assert not wrong, "imports from a lower layer to a higher one:\n" + "\n".join(wrong)


# Calls between native layers: a function defined in one layer's .c file may
# call functions of its own layer and those below, never one defined above
# (an algorithm does not call back into the communicator). Definitions are
# the non-static functions starting at column 0; calls are names followed by
# "(" anywhere else.
_DEF = re.compile(r"^(?!static\b)[A-Za-z_][\w \t\*]*?\b(coll_\w+)\s*\([^;]*$", re.M)
_CALL = re.compile(r"\b(coll_\w+)\s*\(")


def _native_upward_calls(sources: dict) -> list:
    defined = {}
    for rel, text in sources.items():
        for name in _DEF.findall(text):
            defined[name] = rel
    wrong = []
    for rel, text in sorted(sources.items()):
        layer = _layer_of(Path(rel))
        if layer not in LAYERS:
            continue
        for name in sorted(set(_CALL.findall(text))):
            home = defined.get(name)
            if home is None or home == rel:
                continue
            theirs = _layer_of(Path(home))
            if theirs in LAYERS and LAYERS.index(theirs) > LAYERS.index(layer):
                wrong.append(f"{rel} ({layer}) calls {name}, defined in {home} ({theirs})")
    return wrong


def test_native_call_check_finds_an_upward_call():
    sources = {"comm/comm.c": "coll_result_t coll_comm_break(coll_comm_t *c) {\n}\n",
               "schedule/p2p.c": "static void f(void) {\n  coll_comm_break(c);\n}\n"}
    assert _native_upward_calls(sources) == [
        "schedule/p2p.c (schedule) calls coll_comm_break, defined in comm/comm.c (comm)"]


def test_native_calls_only_go_down():
    sources = {str(p.relative_to(NATIVE)): p.read_text() for p in _native_files()
               if p.suffix in {".c", ".cu", ".cc"}}
    wrong = _native_upward_calls(sources)
    assert not wrong, "native calls from a lower layer to a higher one:\n" + "\n".join(wrong)


def test_public_import_paths_survive_the_layout():
    """What users import and run keeps working whatever moves inside (issue 33)."""
    import importlib
    import subprocess
    import sys

    import collectives
    from collectives import MPI

    assert MPI.COMM_WORLD.Get_size() >= 1 and callable(MPI.Comm.Allreduce)
    for name in ("collectives.MPI", "collectives.config", "collectives.run", "collectives.ps",
                 "collectives.bench", "collectives.launcher"):
        assert importlib.import_module(name).__doc__
    # the console scripts' targets, and the -m forms the README shows
    from collectives.run import main as run_main
    from collectives.launcher.cli import main as cli_main
    assert run_main is cli_main
    from collectives.bench.driver import main as bench_main  # noqa: F401
    cwd = Path(collectives.__file__).resolve().parents[1]
    for module in ("collectives.run", "collectives.launcher", "collectives.config"):
        out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                             text=True, timeout=60, cwd=cwd)
        assert out.returncode == 0, (module, out.stderr[-2000:])
