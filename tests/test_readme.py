"""The examples of README.md and of the documentation pages keep working: each check reads the
file that shows the text it checks."""
from pathlib import Path

import pytest

from perfmodel import collective_time

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# Every file whose ```python blocks are run (```py blocks need ranks, root or a GPU: shown, not run).
WITH_PYTHON = [README, *sorted(DOCS.glob("*.md"))]


def _blocks(text: str, lang: str) -> list[str]:
    return [b.split("```", 1)[0] for b in text.split(f"```{lang}\n")[1:]]


def test_cluster_toml_builds_and_predicts(tmp_path):
    """docs/contributing.md, "Write a cluster file"."""
    text = (DOCS / "contributing.md").read_text()
    toml = next(b for b in _blocks(text, "toml") if "[node]" in b)
    path = tmp_path / "my.toml"
    path.write_text(toml)
    r = collective_time("allreduce", 1 << 26, cluster=str(path), nodes=3, compressor="int8")
    assert r.gpus == 12 and r.time_s > 0


def test_readme_names_the_two_commands():
    text = README.read_text()
    assert "make demo" in text and "make test" in text


def test_python_blocks_run():
    ran = 0
    for path in WITH_PYTHON:
        for block in _blocks(path.read_text(), "python"):
            exec(compile(block, str(path.relative_to(ROOT)), "exec"), {})
            ran += 1
    assert _blocks(README.read_text(), "python") and ran >= 4


def test_model_toml_loads(tmp_path):
    """docs/predict.md, "Models"."""
    from perfmodel.workload import load_model

    text = (DOCS / "predict.md").read_text()
    toml = next(b for b in _blocks(text, "toml") if "hidden_size" in b)
    path = tmp_path / "mine.toml"
    path.write_text(toml)
    assert load_model(str(path)).params == load_model("llama3-8b").params


def test_layout_names_every_module():
    """docs/layout.md lists every module of the three packages (by its name)."""
    import re

    text = (DOCS / "layout.md").read_text()
    start = text.index("```")
    layout = text[start:text.index("```", start + 3)]
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", layout))
    missing = [str(p.relative_to(ROOT)) for pkg in ("topologies", "perfmodel", "realrun")
               for p in (ROOT / pkg).rglob("*.py") if p.stem not in ("__init__", "__main__") and p.stem not in words]
    assert not missing, missing


def test_layout_lists_every_benchmark_and_script():
    text = (DOCS / "layout.md").read_text()
    files = sorted(p for d in ("benchmarks", "scripts") for p in (ROOT / d).iterdir()
                   if p.is_file() and p.suffix in (".py", ".sh"))
    missing = [str(p.relative_to(ROOT)) for p in files if f"`{p.relative_to(ROOT)}`" not in text]
    assert not missing, missing


@pytest.mark.parametrize("name", ["README.md", "docs/accuracy.md"])
def test_published_table_is_generated(name):
    """The published-measurements table is what scripts/readme_published.py writes."""
    import importlib.util

    path = ROOT / "scripts" / "readme_published.py"
    spec = importlib.util.spec_from_file_location("readme_published", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert ROOT / name in mod.FILES
    assert mod.current_block((ROOT / name).read_text()) == mod.generated_block()
