"""No class under commsched/ is over 400 lines: a guard against monsters, not a size to cut to.

A class is split where a new object owns something (its own state, as Session holds its
WorldBinding, Accumulation and ElasticGuard: docs/architecture.md), never to pass a line
count (issue 75, item 5). At 300 lines the limit made six classes sit at 297-300 lines, cut to
it rather than around an owner.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "commsched"
MAX_LINES = 400


def _class_lengths() -> dict[str, int]:
    lengths = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"
                lengths[where] = node.end_lineno - node.lineno + 1
    return lengths


def test_no_class_over_400_lines() -> None:
    lengths = _class_lengths()
    assert any(name.endswith(" Session") for name in lengths)  # the scan found the package
    too_long = {where: n for where, n in lengths.items() if n > MAX_LINES}
    assert not too_long, f"classes over {MAX_LINES} lines: {too_long}"
