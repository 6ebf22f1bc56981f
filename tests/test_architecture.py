"""DESIGN section 1: topologies <- perfmodel <- realrun; the model never imports torch or cupy."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "topologies": {"perfmodel", "realrun", "torch", "cupy"},
    "perfmodel": {"realrun", "torch", "cupy"},
    "realrun": {"cupy"},   # cupy only inside realrun.gpu (GPU kernels), imported lazily
}


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
        bad += [f"{path.relative_to(ROOT)} imports {m}" for m in _imports(path) if m in FORBIDDEN[package]]
    assert not bad, bad
