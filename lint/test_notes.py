"""The code's Notes (issue 56, item 3): each defined once, each reference naming one.

A Note is defined the way PyTorch's DDP defines its own: a title line that holds only
``Note [Title]``, in a comment (``#``, ``//``) or a docstring, optionally underlined with ``~``,
and its body on the lines below. Anything else that names a Note is a reference, running text
such as ``see Note [Title]`` or ``(Note [Title] in runtime/planning/lifecycle.py)``; a reference
may wrap
across lines of a comment. A reference that names a file (``Note [Title] in <file>``,
``Note [Title], <file>``, ``Note [Title] (<file>)``, ``(<file>, Note [Title]`` or a dotted
module such as ``commsched.world.broadcast``) must name the file that defines the Note, by a
path suffix (a basename is one). docs/architecture.md ends with the index of every Note, one
line each: ``- [Title] — path/to/file.py``.

This file is left out of the scan: its examples name Notes that do not exist.
"""

from __future__ import annotations

import bisect
import functools
import pathlib
import re
from collections import defaultdict
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[1]
THIS = pathlib.Path(__file__).resolve()
SCANNED_DIRS = ("commsched", "csrc", "scripts", "tests", "lint", "examples", "docs",
                "benchmarks/harness")
TEXT_SUFFIXES = frozenset({".py", ".pyi", ".h", ".cpp", ".cu", ".cuh", ".sh", ".md", ".txt",
                           ".yaml", ".yml", ".toml"})
# Files that may define a Note; a Markdown page only refers to them.
SOURCE_SUFFIXES = frozenset({".py", ".pyi", ".h", ".cpp", ".cu", ".cuh", ".sh"})
ARCHITECTURE = "docs/architecture.md"
INDEX_HEADING = "## Notes"

TITLE_LINE = re.compile(r"""^\s*(?P<lead>#+|//+|[rRuU]?\"\"\"|[rRuU]?''')?\s*"""
                        r"""Note \[(?P<title>[^\[\]]+)\]\s*$""")
UNDERLINE = re.compile(r"^\s*(?:#+|//+)?\s*~+\s*$")
# What a continuation line of a comment starts with, dropped when lines are joined.
LINE_LEAD = re.compile(r"^\s*(?:#+|//+|\*(?!\*))?\s*")
MENTION = re.compile(r"Note\s+\[(?P<title>[^\[\]]{1,200})\]")
# After a mention's closing bracket: " in <file>", ", <file>" or " (<file>", the file possibly
# in backticks or after the end of a string literal that the next line continues.
POINTER_AFTER = re.compile(r"\][\"\s]*(?:\bin\b|,|\()[\"`\s]*(?P<file>[\w./+-]+)")
# Before a mention: "(<file>, " or "(<file>, see ".
POINTER_BEFORE = re.compile(r"\(`?(?P<file>[\w./+-]+)`?,\s*(?:see\s+)?$")
DOTTED_MODULE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
INDEX_ENTRY = re.compile(r"^- \[(?P<title>[^\[\]]+)\] — (?P<path>\S+)$")


@dataclass(frozen=True)
class Definition:
    title: str
    path: str  # relative to the repository root, with '/'
    line: int
    has_body: bool

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Reference:
    title: str
    path: str
    line: int
    pointer: str | None  # the file the reference names, as written

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Scan:
    definitions: tuple[Definition, ...]
    references: tuple[Reference, ...]
    paths: tuple[str, ...]  # every file scanned

    def defined(self) -> dict[str, list[Definition]]:
        out: dict[str, list[Definition]] = defaultdict(list)
        for d in self.definitions:
            out[d.title].append(d)
        return out


def normalise(title: str) -> str:
    """A title as written, with its line breaks and string-literal seams made single spaces."""
    return " ".join(title.replace('"', " ").split())


def scanned_files(root: pathlib.Path) -> list[pathlib.Path]:
    files: list[pathlib.Path] = []
    for folder in SCANNED_DIRS:
        files += [p for p in (root / folder).rglob("*")
                  if p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts and p.is_file()]
    if (root / "README.md").is_file():
        files.append(root / "README.md")
    files += [p for p in (root / "benchmarks").rglob("*.md") if p.is_file()]
    return sorted({p for p in files if p.resolve() != THIS})  # harness/*.md: found twice


def definitions_in(path: str, lines: list[str]) -> list[Definition]:
    """The title lines of `lines`; none in a file that cannot define a Note."""
    if pathlib.PurePosixPath(path).suffix not in SOURCE_SUFFIXES:
        return []
    out = []
    for i, text in enumerate(lines):
        m = TITLE_LINE.match(text)
        if m is None:
            continue
        rest = lines[i + 1:i + 3]
        if rest and UNDERLINE.match(rest[0]):
            rest = rest[1:]
        body = rest[0].strip() if rest else ""
        lead = m.group("lead") or ""
        # A comment's title continues into a comment with text in it; a docstring's, into text.
        marker = lead[0] if lead[:1] in ("#", "/") else ""
        has_body = bool(body) and body.startswith(marker) and bool(body.lstrip("#/ "))
        out.append(Definition(normalise(m.group("title")), path, i + 1, has_body))
    return out


def pointed_file(token: str, paths: tuple[str, ...]) -> str | None:
    """The file a pointer's token names, as a path (suffix); None where it names no file."""
    token = token.rstrip(".,;:")
    if pathlib.PurePosixPath(token).suffix in TEXT_SUFFIXES:
        return token
    if DOTTED_MODULE.fullmatch(token):
        module = token.replace(".", "/") + ".py"
        if any(names_file(p, module) for p in paths):
            return module
    return None


def names_file(path: str, pointer: str) -> bool:
    return path == pointer or path.endswith("/" + pointer)


def references_in(path: str, lines: list[str], skip: set[int],
                  paths: tuple[str, ...]) -> list[Reference]:
    """Every mention of a Note in `lines` outside the title lines `skip` (1-based), read from
    the lines joined, so that a reference may wrap across the lines of a comment."""
    starts: list[int] = []
    parts: list[str] = []
    offset = 0
    for text in lines:
        part = LINE_LEAD.sub("", text, count=1).rstrip()
        starts.append(offset)
        parts.append(part)
        offset += len(part) + 1
    joined = " ".join(parts)
    out = []
    for m in MENTION.finditer(joined):
        line = bisect.bisect_right(starts, m.start())
        if line in skip:
            continue
        pointer = None
        after = POINTER_AFTER.match(joined, m.end() - 1)
        if after is not None:
            pointer = pointed_file(after.group("file"), paths)
        if pointer is None:
            before = POINTER_BEFORE.search(joined, max(0, m.start() - 200), m.start())
            if before is not None:
                pointer = pointed_file(before.group("file"), paths)
        out.append(Reference(normalise(m.group("title")), path, line, pointer))
    return out


def scan_texts(texts: dict[str, str]) -> Scan:
    """Definitions and references in `texts` (path relative to the root -> contents)."""
    paths = tuple(sorted(texts))
    definitions: list[Definition] = []
    references: list[Reference] = []
    for path in paths:
        lines = texts[path].splitlines()
        found = definitions_in(path, lines)
        definitions += found
        references += references_in(path, lines, {d.line for d in found}, paths)
    return Scan(tuple(definitions), tuple(references), paths)


@functools.cache
def scan() -> Scan:
    return scan_texts({p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
                       for p in scanned_files(ROOT)})


def index_entries(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The (title, path) lines of the architecture page's Note index, and its list lines that
    do not read as one."""
    lines = text.splitlines()
    assert INDEX_HEADING in lines, f"{ARCHITECTURE} has no '{INDEX_HEADING}' section"
    entries: list[tuple[str, str]] = []
    malformed: list[str] = []
    for text_line in lines[lines.index(INDEX_HEADING) + 1:]:
        if text_line.startswith("## ") or text_line.startswith("# "):
            break
        if not text_line.startswith("- "):
            continue
        m = INDEX_ENTRY.match(text_line)
        if m is None:
            malformed.append(text_line)
        else:
            entries.append((m.group("title"), m.group("path").strip("`")))
    return entries, malformed


# -- the parser, on text made up here ------------------------------------------------------------

def test_the_parser_reads_titles_wrapped_references_and_pointers() -> None:
    texts = {
        "pkg/a.py": ("# Note [Alpha]\n"
                     "# Alpha's body, which points on (Note [Beta] in\n"
                     "# pkg/b.py) and (Note\n"
                     "# [Gamma], c.cpp).\n"
                     "x = 1  # see Note [Alpha]\n"
                     "# Note [Alpha]\n"
                     "y = 2\n"),
        "pkg/b.py": ('"""Module.\n\nNote [Beta]\n~~~~~~~~~~~\nBeta\'s body (pkg.a, Note [Alpha]).\n'
                     '"""\n'
                     'MESSAGE = ("(Note [Gamma] in "\n'
                     '           "pkg/c.cpp)")\n'),
        "pkg/c.cpp": "// Note [Gamma]\n// Gamma's body, as Note [Beta] in the engine says.\n",
        "docs/d.md": "Note [Delta]\nis no definition in a page (`pkg/a.py`, see Note [Alpha]).\n",
    }
    result = scan_texts(texts)
    assert [(d.title, d.where, d.has_body) for d in result.definitions] == [
        ("Alpha", "pkg/a.py:1", True), ("Alpha", "pkg/a.py:6", False),
        ("Beta", "pkg/b.py:3", True), ("Gamma", "pkg/c.cpp:1", True)]
    assert [(r.title, r.where, r.pointer) for r in result.references] == [
        ("Delta", "docs/d.md:1", None), ("Alpha", "docs/d.md:2", "pkg/a.py"),
        ("Beta", "pkg/a.py:2", "pkg/b.py"), ("Gamma", "pkg/a.py:3", "c.cpp"),
        ("Alpha", "pkg/a.py:5", None), ("Alpha", "pkg/b.py:5", "pkg/a.py"),
        ("Gamma", "pkg/b.py:7", "pkg/c.cpp"), ("Beta", "pkg/c.cpp:2", None)]


# -- the repository's Notes ----------------------------------------------------------------------

def test_the_scan_finds_the_notes() -> None:
    result = scan()
    defined = result.defined()
    assert len(defined) >= 60, f"only {len(defined)} Notes found: is the scan broken?"
    assert [d.path for d in defined["Elastic Horovod"]] == ["commsched/world/bootstrap.py"]
    assert "csrc/device_clock.cpp" in [d.path for d in defined["Device time"]]
    assert len(result.references) > len(result.definitions)


def test_every_reference_names_a_defined_note() -> None:
    result = scan()
    defined = result.defined()
    bad = [f"{r.where}: Note [{r.title}]" for r in result.references if r.title not in defined]
    assert not bad, ("references to a Note that no title line defines (a typo, a renamed Note, "
                     "or a Note defined inline instead of on a title line of its own):\n"
                     + "\n".join(bad))


def test_no_two_notes_share_a_title() -> None:
    shared = [f"Note [{title}]: " + ", ".join(d.where for d in found)
              for title, found in sorted(scan().defined().items()) if len(found) > 1]
    assert not shared, ("Notes defined more than once (a reference written as a title line of "
                        "its own reads as a definition: give it running text, e.g. 'See "
                        "Note [X].'):\n" + "\n".join(shared))


def test_every_note_has_a_body() -> None:
    bare = [f"{d.where}: Note [{d.title}]" for d in scan().definitions if not d.has_body]
    assert not bare, ("title lines with no body right below them (the Note's text, in the same "
                      "comment or docstring, after an optional ~~~ underline):\n"
                      + "\n".join(bare))


def test_a_pointer_names_the_file_that_defines_its_note() -> None:
    result = scan()
    defined = result.defined()
    stale = []
    for r in result.references:
        if r.pointer is None or r.title not in defined:
            continue
        homes = [d.path for d in defined[r.title]]
        if not any(names_file(home, r.pointer) for home in homes):
            stale.append(f"{r.where}: Note [{r.title}] points to {r.pointer}, "
                         f"but it is defined in {', '.join(homes)}")
    assert not stale, "stale pointers:\n" + "\n".join(stale)


def test_the_architecture_index_lists_every_note_and_its_file() -> None:
    entries, malformed = index_entries((ROOT / ARCHITECTURE).read_text(encoding="utf-8"))
    assert not malformed, (f"lines of {ARCHITECTURE}'s Note index that are not "
                           "'- [Title] — path/to/file':\n" + "\n".join(malformed))
    listed: dict[str, list[str]] = defaultdict(list)
    for title, path in entries:
        listed[title].append(path)
    problems = [f"listed {len(paths)} times: [{title}]"
                for title, paths in sorted(listed.items()) if len(paths) > 1]
    defined = scan().defined()
    for title, found in sorted(defined.items()):
        home = found[0].path
        if title not in listed:
            problems.append(f"missing: - [{title}] — {home}")
        elif home not in listed[title]:
            problems.append(f"wrong file: [{title}] is listed under {', '.join(listed[title])}, "
                            f"defined in {home}")
    problems += [f"no such Note: [{title}] ({', '.join(paths)})"
                 for title, paths in sorted(listed.items()) if title not in defined]
    assert not problems, (f"{ARCHITECTURE}, section '{INDEX_HEADING}', does not list exactly the "
                          "defined Notes:\n" + "\n".join(problems))
