"""No docstring paragraph is broken by an overflowing re-wrap (issue #19).

A past re-wrap pushed the overflow of long docstring lines onto a line of its own (often at column 0), leaving a
one- or two-word fragment in the middle of a paragraph, e.g. ``the α`` / ``grid,`` / ``CKS and ...``. This
test finds such fragments in every docstring of the project's Python files: a short line (≤ 30 characters)
after a long one (≥ 80) that is neither the end of a sentence or a list item, nor a definition-list term, nor
part of a literal block, with the paragraph going on after it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("dasflow", "flows", "tasks", "validation", "benchmarks", "tests")
_LIST_ITEM = re.compile(r"^([*\-] |\d+\. )")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _docstrings(tree: ast.AST) -> list[ast.Constant]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.append(first.value)
    return out


def fragments(source: str) -> list[tuple[int, str]]:
    """(line number, fragment) of every broken-wrap fragment in the docstrings of ``source``."""
    lines = source.splitlines()
    found = []
    for doc in _docstrings(ast.parse(source)):
        end = doc.end_lineno or doc.lineno
        for i in range(doc.lineno, end - 1):  # 0-based index of the candidate line (never the first or last)
            prev, frag, nxt = lines[i - 1], lines[i], lines[i + 1]
            text = frag.strip()
            if not text or not prev.strip() or not nxt.strip() or nxt.strip().startswith('"""'):
                continue
            if len(text) > 30 or len(prev) < 80 or _indent(frag) > _indent(prev):
                continue
            if text.endswith((".", ":")) or _LIST_ITEM.match(nxt.strip()):
                continue  # a sentence or list item ends here; the next line starts a new one
            if text.startswith("``") and _indent(frag) < _indent(nxt):
                continue  # a definition-list term
            if "{" in text or "}" in text:
                continue  # a literal block (JSON, a dict) laid out by hand
            found.append((i + 1, text))
    return found


def test_fragments_are_found() -> None:
    broken = '''def f() -> None:
    """A paragraph whose second line overflowed when it was re-wrapped, leaving a word on a line of its
own
    before the rest of the paragraph goes on as usual."""
'''
    assert fragments(broken) == [(3, "own")]
    assert fragments(broken.replace("its\nown\n", "its own\n")) == []


def test_no_docstring_has_a_broken_wrap() -> None:
    broken = [f"{path.relative_to(ROOT)}:{line}: {text!r}"
              for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
              for line, text in fragments(path.read_text(encoding="utf-8"))]
    assert broken == []
