"""docs/benchmarks.md's contents list matches its headings (experiments/docs_contents.py)."""

import pathlib

import pytest

from experiments import docs_contents

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_benchmarks_contents_match_the_headings():
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert docs_contents.current(text) == docs_contents.contents(text), (
        "docs/benchmarks.md's contents list is stale: run python -m experiments.docs_contents "
        "docs/benchmarks.md --write")


def test_anchors_and_rewrite(tmp_path, capsys):
    assert docs_contents.anchor("One H100 with jla (2026-11-26), L = 16,384") == (
        "one-h100-with-jla-2026-11-26-l--16384")
    assert docs_contents.anchor("`lion_dense`'s d log_decay") == "lion_denses-d-log_decay"
    page = tmp_path / "page.md"
    page.write_text("# T\n\nContents:\n\n- [Old](#old)\n\n## A, b\n\ntext\n\n### C `d`\n\n"
                    "#### too deep\n")
    docs_contents.main([str(page), "--write"])
    assert page.read_text() == ("# T\n\nContents:\n\n- [A, b](#a-b)\n  - [C `d`](#c-d)\n\n"
                                "## A, b\n\ntext\n\n### C `d`\n\n#### too deep\n")
    assert capsys.readouterr().out == "- [A, b](#a-b)\n  - [C `d`](#c-d)\n"
    page.write_text("# no list\n")
    with pytest.raises(SystemExit, match="error: .*has no 'Contents:' line"):
        docs_contents.main([str(page)])
