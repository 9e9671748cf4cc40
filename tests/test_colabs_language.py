"""The language notebooks of colabs/ (``test_colabs.LANGUAGE``) run top to bottom on CPU, in a
file of their own so that another worker can take them (see ``test_colabs.py``)."""

import pytest

from test_colabs import LANGUAGE, NOTEBOOKS, run_notebook


@pytest.mark.optimized_xla
@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name in LANGUAGE],
                         ids=lambda p: p.name)
def test_notebook_runs(path):
    run_notebook(path)
