"""The contents list of a Markdown reference page (docs/benchmarks.md), rebuilt from its
``##`` and ``###`` headings with GitHub's anchors.

    python -m experiments.docs_contents docs/benchmarks.md [--write]

Prints the list; ``--write`` puts it in place of the list under the page's ``Contents:`` line.
``tests/test_docs_contents.py`` checks that the page's list is the one its headings give.
"""

import re
import sys

MARKER = "Contents:"


def anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _list_span(lines):
    """``(start, end)``: the line indices of the contents list (after ``MARKER`` and a blank
    line, up to the next blank line)."""
    if MARKER not in lines:
        raise ValueError(f"the page has no '{MARKER}' line")
    start = lines.index(MARKER) + 2
    end = start
    while end < len(lines) and lines[end].strip():
        end += 1
    return start, end


def contents(text):
    """The contents list of ``text`` (Markdown) as lines: its ``##`` and ``###`` headings after
    the list, nested by level, each a link to its anchor."""
    lines = text.split("\n")
    _, end = _list_span(lines)
    items = []
    for line in lines[end:]:
        match = re.match(r"^(#{2,3}) (.+)$", line)
        if match:
            indent = "  " * (len(match.group(1)) - 2)
            items.append(f"{indent}- [{match.group(2)}](#{anchor(match.group(2))})")
    return items


def current(text):
    """The contents list as the page holds it now, as lines."""
    lines = text.split("\n")
    start, end = _list_span(lines)
    return lines[start:end]


def rewritten(text):
    """``text`` with its contents list rebuilt from its headings."""
    lines = text.split("\n")
    start, end = _list_span(lines)
    return "\n".join(lines[:start] + contents(text) + lines[end:])


def main(argv):
    paths = [a for a in argv if not a.startswith("--")]
    if len(paths) != 1 or set(argv) - set(paths) - {"--write"}:
        sys.exit("error: usage: python -m experiments.docs_contents PAGE.md [--write]")
    try:
        text = open(paths[0]).read()
        items = contents(text)
    except (OSError, ValueError) as e:
        sys.exit(f"error: {paths[0]}: {e}")
    if "--write" in argv:
        with open(paths[0], "w") as f:
            f.write(rewritten(text))
    print("\n".join(items))


if __name__ == "__main__":
    main(sys.argv[1:])
