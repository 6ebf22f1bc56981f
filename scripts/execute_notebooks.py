"""Run notebooks top to bottom and write them back with their outputs (what a reader of the
repository sees): ``python scripts/execute_notebooks.py notebooks/04_search.ipynb ...``. Each runs
in its own folder as the tests run it (``tests/test_notebooks.py``); a failing cell stops it and
nothing is written."""
from __future__ import annotations

import pathlib
import sys
import tempfile

import nbclient
import nbformat


def execute(path: pathlib.Path, timeout_s: int = 600) -> None:
    book = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as where:
        nbclient.NotebookClient(book, timeout=timeout_s, kernel_name="python3",
                                resources={"metadata": {"path": where}}).execute()
    tmp = path.with_suffix(".ipynb.tmp")
    nbformat.write(book, tmp)
    tmp.replace(path)     # atomic: a failed run leaves the committed notebook as it was


if __name__ == "__main__":
    for name in sys.argv[1:] or sorted(str(p) for p in pathlib.Path("notebooks").glob("*.ipynb")):
        print("executing", name, flush=True)
        execute(pathlib.Path(name))
