"""No class under commsched/ is over 300 lines (issue 56, item 1: one owner per object's state).
A class that grows past it holds more than one concern: move one into an object it holds, as
Session holds its WorldBinding, Accumulation and ElasticGuard (docs/architecture.md)."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "commsched"
MAX_LINES = 300


def _class_lengths() -> dict[str, int]:
    lengths = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"
                lengths[where] = node.end_lineno - node.lineno + 1
    return lengths


def test_no_class_over_300_lines() -> None:
    lengths = _class_lengths()
    assert any(name.endswith(" Session") for name in lengths)  # the scan found the package
    too_long = {where: n for where, n in lengths.items() if n > MAX_LINES}
    assert not too_long, f"classes over {MAX_LINES} lines: {too_long}"
