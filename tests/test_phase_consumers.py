"""Step phases are declared once (perfmodel.phases, perfmodel.axes: each axis owns its phase) and
every consumer derives its columns from ``perfmodel.axes.PHASES``: no table of phase names by
hand anywhere else. A table by hand already shipped a bug (the breakdown plot lacked ep's and
cp's phases: a MoE step's bars added up to less than its step).

The rule, precise enough to keep: outside the declarations, in perfmodel/, realrun/, scripts/,
benchmarks/ and the notebooks' code cells, no tuple, list, set or dict display holds two or more
phase names as string literals (its items, a dict's keys and values, and the items of the
displays directly inside it: a table of pairs), no class declares two or more fields named as
phases, no call passes two or more keywords named as phases. One name alone
(``breakdown["ep_comm_s"]``, ``b.add(COMPRESSION, s)``) is a lookup, not a table.
"""
import ast
import json
from pathlib import Path


from perfmodel.axes import PHASE_NAMES

ROOT = Path(__file__).resolve().parents[1]
DECLARATIONS = {"perfmodel/phases.py", "perfmodel/axes.py"}
# realrun's training reports: they measure the declared phases by name (once tables by hand)
REALRUN = {"realrun/train/trainer.py", "realrun/train/report.py", "realrun/validate_training.py"}


def _display_items(node) -> list:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return node.elts
    if isinstance(node, ast.Dict):
        return [k for k in node.keys if k is not None] + node.values
    return []


def _names(items) -> list[str]:
    return [i.value for i in items if isinstance(i, ast.Constant) and i.value in PHASE_NAMES]


def phase_tables(source: str) -> list[tuple[int, list[str]]]:
    """(line, phase names) of every table of phases by hand in ``source`` (module doc)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            names = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                     and s.target.id in PHASE_NAMES]
        elif isinstance(node, ast.Call):
            names = [k.arg for k in node.keywords if k.arg in PHASE_NAMES]
        else:
            items = _display_items(node)
            names = _names(items) + [n for i in items for n in _names(_display_items(i))]
        if len(names) >= 2:
            found.append((node.lineno, names))
    return found


def _sources() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for folder in ("perfmodel", "realrun", "scripts", "benchmarks")
                  for p in (ROOT / folder).rglob("*.py"))


def _notebooks() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("*.ipynb"))


def _code(path: str) -> str:
    """A source file's text; a notebook's code cells, one after another (IPython's % and ! lines left out)."""
    text = (ROOT / path).read_text()
    if not path.endswith(".ipynb"):
        return text
    cells = ["".join(c["source"]) for c in json.loads(text)["cells"] if c["cell_type"] == "code"]
    return "\n".join(line for cell in cells for line in cell.splitlines() if not line.lstrip().startswith(("%", "!")))


def _violations(paths) -> list[str]:
    return [f"{path}:{line}: {', '.join(names)}" for path in paths for line, names in phase_tables(_code(path))]


def test_the_rule_finds_a_table_by_hand():
    assert phase_tables('P = ("compute_s", "tp_comm_s", "bubble_s")') == [(1, ["compute_s", "tp_comm_s", "bubble_s"])]
    assert phase_tables('SHORT = {"ep_comm_s": "ep", "cp_comm_s": "cp"}')[0][1] == ["ep_comm_s", "cp_comm_s"]
    assert phase_tables('for k, n in (("optimizer_s", "optimizer"), ("bubble_s", "bubble")): pass')[0][0] == 1
    assert phase_tables('class B:\n    compute_s: float = 0.0\n    tp_comm_s: float = 0.0')[0][1] == ["compute_s",
                                                                                                  "tp_comm_s"]
    assert phase_tables('B(compute_s=1.0, bubble_s=2.0)')[0][1] == ["compute_s", "bubble_s"]
    assert phase_tables('x = ["compute_s", "gemm_s"]\ny = b["ep_comm_s"]\nif k in ("forward_s",): pass') == []


def test_the_scan_sees_every_consumer():
    sources = set(_sources())
    assert "notebooks/01_predict_clusters_you_do_not_have.ipynb" in _notebooks() and len(_notebooks()) > 1
    assert sources >= DECLARATIONS | REALRUN | {"perfmodel/report/text.py", "perfmodel/report/plots.py",
                                                  "perfmodel/step/timing.py", "perfmodel/engines/analytical.py",
                                                  "perfmodel/report/trace.py", "perfmodel/engines/des.py"}


def test_no_consumer_lists_phases_by_hand():
    paths = [p for p in _sources() + _notebooks() if p not in DECLARATIONS]
    assert _violations(paths) == []
