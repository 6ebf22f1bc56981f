"""docs/design.md, Layering: topologies <- perfmodel <- realrun; the model never imports torch or cupy."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "topologies": {"perfmodel", "realrun", "torch", "cupy"},
    "perfmodel": {"realrun", "torch", "cupy"},
    "realrun": {"cupy"},   # cupy only inside realrun/gpu (GPU kernels), imported lazily
}
ALLOWED = {("realrun", "cupy"): "realrun/gpu/"}


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_respect_layering(package):
    bad = []
    for path in (ROOT / package).rglob("*.py"):
        rel = str(path.relative_to(ROOT))
        bad += [f"{rel} imports {m}" for m in _imports(path) if m in FORBIDDEN[package]
                and not rel.startswith(ALLOWED.get((package, m), "\0"))]
    assert not bad, bad


def test_perfmodel_installs_without_torch():
    """`pip install commpress` must give a working perfmodel: torch and cupy stay in extras."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    assert "torch" not in core and "cupy" not in core
    real = project["optional-dependencies"]["real"]
    assert any(d.startswith("torch>=") for d in real), real   # a range: a user's own CUDA torch stays
    pins = (ROOT / "constraints.txt").read_text().split()
    assert "torch==2.13.0" in pins and "zfpy==1.0.1" in pins   # what CI installs
    assert "-c constraints.txt" in (ROOT / "Makefile").read_text()


def _top_level_imports(path: Path):
    """Modules a file imports at module level (not inside functions: those load on use)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0]


def test_topologies_imports_networkx_and_numpy_and_loads_the_rest_on_use():
    """docs/design.md, Layering: at import, topologies needs networkx and numpy only; scipy
    (routing) and matplotlib (draw, imported by the CLI only when drawing) load on use."""
    import sys

    allowed = set(sys.stdlib_module_names) | {"topologies", "networkx", "numpy", "__future__"}
    bad = []
    for path in (ROOT / "topologies").rglob("*.py"):
        extra = {"matplotlib"} if path.name == "draw.py" else set()
        bad += [f"{path.name} imports {m}" for m in _top_level_imports(path) if m not in allowed | extra]
    assert not bad, bad


def _module_imports(path: Path, modules: dict) -> set:
    """The project modules ``path`` imports anywhere (functions too; ``TYPE_CHECKING`` blocks
    aside), each named as ``modules`` names it; its own packages aside (their __init__ runs first)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for b in node.body for n in ast.walk(b)}
    own = next(name for name, p in modules.items() if p == path)
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                     for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != own and not own.startswith(name + "."):
                out.add(name)
    return out


def test_no_import_cycles():
    """A cycle hidden by a function-local import is still a cycle: modules that need each other
    belong together, or the shared part in a module of its own (docs/design.md, Layering)."""
    import networkx as nx

    modules = {}
    for package in FORBIDDEN:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    graph = nx.DiGraph((name, other) for name, path in modules.items() for other in _module_imports(path, modules))
    assert list(nx.simple_cycles(graph)) == []
