"""The documentation stays true to the code, where that can be checked mechanically.

* every module path (``perfmodel/foo.py``, ``realrun/comm/``) and dotted name
  (``perfmodel.explore.search``, ``realrun.comm.Comm``) that README.md, CONTRIBUTING.md and the
  pages of docs/ name exists in the repository;
* every section that code or a catalog cites ("docs/design.md, Data flow") is a heading of
  that page;
* nothing names a path outside the repository (``shared/``, ``../``, a home or work folder);
* README.md stays a front page (at most 300 lines), and every page of docs/ is in the site's nav.

Static and fast: files are read as text (and parsed with ``ast``), nothing is imported.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGES = ("topologies", "perfmodel", "realrun")
PAGES = sorted(DOCS.rglob("*.md"))
TEXTS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *PAGES]
CATALOGS = sorted(p for pkg in ("topologies", "perfmodel") for p in (ROOT / pkg / "catalog").glob("*.toml"))
CODE = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
CITING = CODE + sorted(p for d in ("tests", "benchmarks", "scripts") for p in (ROOT / d).rglob("*.py")) + CATALOGS

# A path into the repository: the packages (any file or folder), and the files of tests,
# benchmarks, scripts, notebooks, docs and validation the text names by extension.
PATH = re.compile(r"(?<![\w./-])((?:topologies|perfmodel|realrun)/[\w./-]*"
                  r"|(?:tests|benchmarks|scripts|notebooks)/[\w./-]*\.(?:py|sh|ipynb)"
                  r"|docs/[\w./-]*\.(?:md|png|csv)"
                  r"|validation/(?:published|convergence)/[\w./-]*)")
DOTTED = re.compile(r"(?<![\w./-])((?:topologies|perfmodel|realrun)(?:\.[A-Za-z_]\w*)+)")
CITATION = re.compile(r"(docs/[\w/]+\.md),\s*['\"]?([A-Z][^\n]{0,120})")
DELIMS = ",:;.)'\"( "
OUTSIDE = re.compile(r"(?<![\w-])shared/|(?<![\w.])\.\./|(?<![\w.~:/-])/(?:work|home|root|Users|mnt|srv)\b|(?<!\w)~/")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _module_file(parts: tuple[str, ...]) -> Path | None:
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _names(path: Path) -> frozenset[str]:
    """What a module defines or exports at its top level, statically: functions, classes,
    assignments, imports, and every string constant (lazy ``__getattr__`` export tables)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            names.add(node.value)
    return frozenset(names)


def _dotted_exists(name: str) -> bool:
    parts = tuple(name.split("."))
    for i in range(len(parts), 0, -1):
        module = _module_file(parts[:i])
        if module is not None:
            return i == len(parts) or parts[i] in _names(module)
    return False


def _path_exists(path: str) -> bool:
    path = path.rstrip(".,:;")
    return (ROOT / path).exists()


def _headings(page: Path) -> list[str]:
    heads = []
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            heads.append(line.lstrip("#").strip().replace("`", "").lower())
    return heads


def _cites(section: str, heading: str) -> bool:
    """``section`` (the cited text and what follows it on the line) names ``heading``: either the
    heading is the start of the text up to a delimiter ("Data flow, assembled in order"), or the
    text's first part is the start of the heading ("Vocabulary" for "Vocabulary and units")."""
    section = section.replace("`", "").lower()
    if section.startswith(heading) and (len(section) == len(heading) or section[len(heading)] in DELIMS):
        return True
    head = re.split(r"[,:;)'\"]|\.(?:\s|$)", section, maxsplit=1)[0].strip()
    return len(head) >= 3 and heading.startswith(head) and (len(heading) == len(head) or heading[len(head)] in DELIMS)


def _joined(path: Path) -> str:
    """The file's text with comment and docstring line breaks undone, so a citation that wraps
    ("The discrete-event\\n# engine") reads as one line."""
    return re.sub(r"\n[ \t]*(?:#[ \t]*)?", " ", path.read_text())


@pytest.mark.parametrize("path", TEXTS, ids=_rel)
def test_named_module_paths_exist(path):
    text = path.read_text()
    missing = sorted({p for p in PATH.findall(text) if "*" not in p and "{" not in p and not _path_exists(p)})
    assert not missing, f"{_rel(path)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("path", TEXTS, ids=_rel)
def test_named_dotted_modules_exist(path):
    text = path.read_text()
    missing = sorted({n for n in DOTTED.findall(text) if not _dotted_exists(n)})
    assert not missing, f"{_rel(path)} names modules or attributes that do not exist: {missing}"


def test_cited_sections_exist():
    cited = 0
    missing = []
    for path in CITING:
        for page, section in CITATION.findall(_joined(path)):
            cited += 1
            target = ROOT / page
            if not target.is_file() or not any(_cites(section, h) for h in _headings(target)):
                missing.append(f"{_rel(path)}: {page}, {section[:60]}")
    assert cited >= 10   # the convention is in use: the scan finds the citations
    assert not missing, "sections cited that no heading of the page matches:\n" + "\n".join(missing)


def test_the_citation_check_fails_on_a_missing_section():
    heads = _headings(DOCS / "design.md")
    assert any(_cites("Data flow, assembled in order.", h) for h in heads)
    assert any(_cites("Vocabulary)", h) for h in heads)
    assert not any(_cites("Facts measured nowhere", h) for h in heads)
    assert not any(_cites("Pipeline bubbles", h) for h in heads)


VALIDATION = sorted(p for p in (ROOT / "validation").rglob("*") if p.suffix in (".md", ".toml"))


@pytest.mark.parametrize("path", [p for p in TEXTS + CATALOGS + CITING + VALIDATION if p != Path(__file__)],
                         ids=_rel)
def test_no_path_outside_the_repository(path):
    hits = [m.group(0) for m in OUTSIDE.finditer(path.read_text())]
    assert not hits, f"{_rel(path)} names paths outside the repository: {hits}"


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move the detail to a page of docs/"
    dated = re.search(r"\b20\d\d-\d\d-\d\d\b", "\n".join(lines))
    assert not dated, "dated measurement narratives go to docs/accuracy.md"


def test_every_page_is_in_the_nav():
    config = (ROOT / "mkdocs.yml").read_text()
    nav = config[config.index("\nnav:"):]
    listed = set(re.findall(r":\s*([\w/.-]+\.md)\s*$", nav, flags=re.M))
    pages = {str(p.relative_to(DOCS)) for p in PAGES}
    assert listed <= pages, f"the nav names pages that do not exist: {sorted(listed - pages)}"
    assert not pages - listed, f"pages outside the nav: {sorted(pages - listed)}"
    assert "strict: true" in config and "reference/" in nav   # broken links fail; the API pages are generated


def test_api_pages_cover_every_module():
    """scripts/gen_ref_pages.py writes a page for every module of a package (static)."""
    text = (ROOT / "scripts" / "gen_ref_pages.py").read_text()
    assert all(f'"{pkg}"' in text for pkg in PACKAGES)
    assert "rglob(\"*.py\")" in text and "::: " in text
