"""The notebooks in notebooks/ run top to bottom (nbclient, the Jupyter project's own executor:
it runs a kernel in-process and raises on the first failing cell; nbmake would add a pytest
plugin for the same). A notebook may be committed with the outputs of its last run
(``scripts/execute_notebooks.py`` writes them) so that a reader sees real results; the test runs a
copy with its outputs cleared, written to a temporary folder."""
import pathlib

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 4


@pytest.mark.slow
@pytest.mark.notebooks
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    book = nbformat.read(path, as_version=4)
    code = [cell for cell in book.cells if cell.cell_type == "code"]
    ran = [cell for cell in code if cell.get("outputs")]
    assert not ran or len(ran) == sum(1 for c in code if c.get("execution_count")), "outputs of a partial run"
    for cell in code:
        cell["outputs"], cell["execution_count"] = [], None
    client = nbclient.NotebookClient(book, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    nbformat.write(book, tmp_path / path.name)
