"""Generate the API reference pages of the documentation site, one per module.

Run by mkdocs-gen-files during ``mkdocs build`` (``mkdocs.yml``: ``plugins: gen-files``): every
module of topologies, perfmodel and realrun gets a page ``reference/<dotted/path>.md`` holding
``::: dotted.name`` (mkdocstrings renders it from the source, statically: griffe reads the files,
nothing is imported), and ``reference/SUMMARY.md`` lists them for mkdocs-literate-nav. A module
renamed or moved needs no edit of the docs: its page follows the file.
"""
from __future__ import annotations

from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("topologies", "perfmodel", "realrun")

nav = mkdocs_gen_files.Nav()
for package in PACKAGES:
    for path in sorted((ROOT / package).rglob("*.py")):
        module = path.relative_to(ROOT).with_suffix("")
        parts = tuple(module.parts)
        if parts[-1] == "__main__":
            continue
        if not all((ROOT / Path(*parts[:i]) / "__init__.py").exists() for i in range(1, len(parts))):
            continue   # not inside a package (a folder without __init__.py): not a module of it
        if parts[-1] == "__init__":
            parts = parts[:-1]
            doc_path = Path(*parts, "index.md")
        else:
            doc_path = module.with_suffix(".md")
        nav[parts] = doc_path.as_posix()
        with mkdocs_gen_files.open(Path("reference", doc_path), "w") as fd:
            fd.write(f"# `{'.'.join(parts)}`\n\n::: {'.'.join(parts)}\n")
        mkdocs_gen_files.set_edit_path(Path("reference", doc_path), path.relative_to(ROOT))

with mkdocs_gen_files.open("reference/index.md", "w") as fd:
    fd.write("# API reference\n\nOne page per module, generated from the docstrings of the source "
             "(griffe reads it; nothing is imported):\n\n"
             + "".join(f"- [`{p}`]({p}/index.md)\n" for p in PACKAGES))

with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as fd:
    fd.write("* [Overview](index.md)\n")
    fd.writelines(nav.build_literate_nav())
