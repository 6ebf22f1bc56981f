"""The README's examples keep working."""
from pathlib import Path

from perfmodel import collective_time

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_cluster_toml_builds_and_predicts(tmp_path):
    text = README.read_text()
    toml = next(b.split("```", 1)[0] for b in text.split("```toml\n")[1:] if "[node]" in b)
    path = tmp_path / "my.toml"
    path.write_text(toml)
    r = collective_time("allreduce", 1 << 26, cluster=str(path), nodes=3, compressor="int8")
    assert r.gpus == 12 and r.time_s > 0


def test_readme_names_the_two_commands():
    text = README.read_text()
    assert "make demo" in text and "make test" in text


def test_readme_python_blocks_run():
    text = README.read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


def test_readme_model_toml_loads(tmp_path):
    from perfmodel.workload import load_model

    text = README.read_text()
    toml = next(b.split("```", 1)[0] for b in text.split("```toml\n")[1:] if "hidden_size" in b)
    path = tmp_path / "mine.toml"
    path.write_text(toml)
    assert load_model(str(path)).params == load_model("llama3-8b").params


def test_readme_layout_names_every_module():
    """README's Layout lists every module of the three packages (by its name)."""
    import re

    text = README.read_text()
    layout = text[text.index("## Layout"):]
    layout = layout[:layout.index("```", layout.index("```") + 3)]
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", layout))
    root = README.parent
    missing = [str(p.relative_to(root)) for pkg in ("topologies", "perfmodel", "realrun")
               for p in (root / pkg).rglob("*.py") if p.stem not in ("__init__", "__main__") and p.stem not in words]
    assert not missing, missing


def test_readme_published_table_is_generated():
    """README's "How close is the model" table is what scripts/readme_published.py writes."""
    import importlib.util

    path = README.parent / "scripts" / "readme_published.py"
    spec = importlib.util.spec_from_file_location("readme_published", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.current_block(README.read_text()) == mod.generated_block()
