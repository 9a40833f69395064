"""No measured timing figure in a comment or docstring under commsched/ (issue 56, item 3).

A figure quoted in the code goes stale with the next run of the benchmark it came from. Measured
figures live in the benchmark reports (benchmarks/*/README.md), and those that no report holds in
benchmarks/notes/README.md; a comment keeps the reasoning, in words ("several times", "well
behind"), and names the report or the section. This test reads every module's COMMENT tokens and
its statement-level strings (docstrings, and any other string that is a statement of its own)
with `tokenize`, and fails on what reads as a timing figure:

* a number with a time unit: ms, us, µs, ns (or the unit's name), or seconds after a decimal
  number (``5.4 s``; a whole number of seconds is a timeout or a default);
* a number with a byte rate: MB/s, GB/s, MiB/s, ... (link settings in bits, ``1 Gbit/s``, are
  the benchmarks' configuration, not a measurement);
* a decimal ratio, ``1.29x``; a decimal percentage, ``2.7%`` (a bound or a knob is written whole:
  ``within 2%``).

Strings that are not statements (error messages, help texts, format strings) are the program's
output, not comments, and are not read. ALLOWED lists the few figures that are no measurement.
"""

from __future__ import annotations

import io
import pathlib
import re
import tokenize
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "commsched"

_NUMBER = r"(?<![\w.])\d+(?:[.,]\d+)*"
_DECIMAL = r"(?<![\w.])\d+\.\d+"
FIGURE = re.compile(
    rf"{_NUMBER}\s?(?:ms|us|µs|μs|ns|milli(?:second)?s?|micro(?:second)?s?|nano(?:second)?s?)"
    r"(?![\w])"
    rf"|{_DECIMAL}\s?(?:s|secs?|seconds?)(?![\w/])"
    rf"|{_NUMBER}\s?[KMGT]i?B/s"
    rf"|{_DECIMAL}\s?[x×](?![\w])"
    rf"|{_DECIMAL}\s?%")

# (path under the repository, text on the flagged line, why it is no measurement). Each entry
# must still match a line: test_every_allowed_figure_is_still_there.
ALLOWED: tuple[tuple[str, str, str], ...] = (
    ("commsched/sim/network.py", "alpha = 100 us, beta = 1 ns/byte",
     "the profiler's default cost model, a constant of the code, named where it applies"),
    ("commsched/sim/compressed.py", "at 4 ns per element",
     "a stated estimate the simulator uses (a constant of the code), not a measurement"),
    ("commsched/sim/builtin_models.py", "at the V100's 900 GB/s",
     "the V100's published memory bandwidth, one of the built-in profiles' stated assumptions"),
    ("commsched/world/liveness.py", "for 6.2 s",
     "an example of the message the function writes, not a figure about the code"),
    ("commsched/reporting/output.py", "at least 0.3% wide",
     "the plot's minimum bar width, a constant of the code"),
    ("commsched/sim/whatif.py", "within 0.05%",
     "the precision the bisection's fixed number of halvings gives, arithmetic"),
)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    text: str  # the whole source line
    figure: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.figure!r} in: {self.text.strip()}"


def _statement_strings(tokens: list[tokenize.TokenInfo]) -> list[tokenize.TokenInfo]:
    """The STRING tokens of logical lines that hold nothing but strings (a docstring, or an
    implicitly concatenated one, possibly in parentheses)."""
    out: list[tokenize.TokenInfo] = []
    line: list[tokenize.TokenInfo] = []
    for tok in tokens:
        if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            strings = [t for t in line if t.type == tokenize.STRING]
            rest = [t for t in line if t.type != tokenize.STRING
                    and not (t.type == tokenize.OP and t.string in "()")]
            if strings and not rest:
                out += strings
            line = []
        elif tok.type in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT,
                          tokenize.ENCODING):
            continue
        else:
            line.append(tok)
    return out


def figures_in(path: str, source: str) -> list[Finding]:
    """Every timing figure in `source`'s comments and statement-level strings."""
    lines = source.splitlines()
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    texts = [t for t in tokens if t.type == tokenize.COMMENT] + _statement_strings(tokens)
    found = []
    for tok in texts:
        for m in FIGURE.finditer(tok.string):
            line = tok.start[0] + tok.string.count("\n", 0, m.start())
            found.append(Finding(path, line, lines[line - 1], m.group(0)))
    return sorted(found, key=lambda f: (f.path, f.line))


def _allowed(finding: Finding) -> bool:
    return any(finding.path == path and snippet in finding.text for path, snippet, _ in ALLOWED)


def package_findings() -> list[Finding]:
    found: list[Finding] = []
    for file in sorted(PACKAGE.rglob("*.py*")):
        if file.suffix not in (".py", ".pyi") or "__pycache__" in file.parts:
            continue
        found += figures_in(file.relative_to(ROOT).as_posix(), file.read_text(encoding="utf-8"))
    return found


# -- the scan, on text made up here --------------------------------------------------------------

def test_the_scan_reads_comments_and_docstrings_only() -> None:
    source = '''"""Module: a step took 29.7 ms."""
import os  # prophet measured 38.7 ms and horovod 35.3
# 42-45 ms for the first block; dear 1.29x bytescheduler, 2.7% ahead; 125 MB/s; 5.4 s


class A:
    """A 4 MiB partition, 2 ranks, within 2%, a 20 s timeout, issue 56, torch 2.4, 4x."""

    def f(self) -> None:
        ("an implicitly concatenated "
         "docstring: 20 us")
        x = "a value, not a comment: 12 ms"
        raise ValueError(f"an error message: {x} took 3.5x, 0.5 ms")
'''
    found = [(f.line, f.figure) for f in figures_in("m.py", source)]
    assert found == [(1, "29.7 ms"), (2, "38.7 ms"), (3, "45 ms"), (3, "1.29x"), (3, "2.7%"),
                     (3, "125 MB/s"), (3, "5.4 s"), (11, "20 us")], found


# -- the package ---------------------------------------------------------------------------------

def test_no_comment_or_docstring_quotes_a_timing_figure() -> None:
    quoted = [str(f) for f in package_findings() if not _allowed(f)]
    assert not quoted, (
        "comments or docstrings under commsched/ quote measured figures, which go stale with the "
        "next run: keep the reasoning in words and name the report that holds the figures "
        "(benchmarks/<benchmark>/README.md), or move them to a section of "
        "benchmarks/notes/README.md and name it; a figure that is no measurement goes in "
        "ALLOWED, with its reason:\n" + "\n".join(quoted))


def test_every_allowed_figure_is_still_there() -> None:
    found = package_findings()
    stale = [f"{path}: {snippet!r}" for path, snippet, _ in ALLOWED
             if not any(f.path == path and snippet in f.text for f in found)]
    assert not stale, "ALLOWED entries that match no figure any more (remove them):\n" + "\n".join(
        stale)
