"""Every notebook in colabs/ runs top to bottom on CPU (code cells executed in order).

The notebooks take about a sixth of the suite's CPU time, so they are split over two files
(this one and ``test_colabs_language.py``) that pytest-xdist's ``--dist loadfile`` can give
to different workers; ``LANGUAGE`` says which file runs which notebook.
"""

import json
import pathlib

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "colabs").glob("*.ipynb"))
LANGUAGE = ("causal_lm.ipynb", "lra_listops.ipynb", "mlm_length_extrapolation.ipynb",
            "scaling_laws.ipynb")  # run by test_colabs_language.py


def run_notebook(path):
    """Executes the code cells of the notebook at ``path`` in order, in one namespace."""
    cells = json.loads(path.read_text())["cells"]
    namespace = {"__name__": "__main__"}
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), f"{path.name}[cell {i}]", "exec"), namespace)


@pytest.mark.optimized_xla
@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name not in LANGUAGE],
                         ids=lambda p: p.name)
def test_notebook_runs(path):
    run_notebook(path)


def test_there_are_notebooks():
    assert NOTEBOOKS, "colabs/ has no notebooks"
    missing = set(LANGUAGE) - {p.name for p in NOTEBOOKS}
    assert not missing, f"LANGUAGE names notebooks that colabs/ does not have: {missing}"
