"""The README's and scripts/README.md's prose keeps the style rules (issue 54, item 2), a lint step
of scripts/test.sh.

The style rules, as measured here:
* a paragraph is a block of text lines between blank lines, outside code fences and tables;
  headings and HTML comments are not paragraphs, and each list item is a paragraph of its own;
* a table cell is the text between two pipes of a table row;
* a word is a run of characters between spaces; a sentence ends at '.', '?' or '!' followed by a
  space (or at the paragraph's end).
Measured this way, the README this issue replaced (402 lines, commit 656fe9d) broke all three:
9 of its 31 paragraphs ran over 80 words (the longest 584), 2 of its cells (the longest 339),
and 42 of its 76 sentences (55%) over 25 words; the median sentence had 30.
"""

from __future__ import annotations

import pathlib
import re

MAX_PARAGRAPH_WORDS = 80
MAX_CELL_WORDS = 80
LONG_SENTENCE_WORDS = 25
MAX_LONG_SENTENCE_SHARE = 0.20

LIST_ITEM = re.compile(r"^\s*([-*]|\d+\.)\s")
SENTENCE_END = re.compile(r"(?<=[.?!])\s+")
ABBREVIATIONS = ("e.g.", "i.e.", "vs.")


def prose(text: str) -> tuple[list[str], list[str]]:
    """(paragraphs, table cells) of a markdown text, as the module docstring defines them."""
    paragraphs: list[str] = []
    cells: list[str] = []
    block: list[str] = []
    fenced = False

    def close() -> None:
        if block:
            paragraphs.append(" ".join(line.strip() for line in block))
            block.clear()

    for line in re.sub(r"<!--.*?-->", "", text, flags=re.DOTALL).splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            close()
            fenced = not fenced
        elif fenced:
            continue
        elif stripped.startswith("|"):
            close()
            cells += [cell.strip() for cell in stripped.strip("|").split("|")
                      if not re.fullmatch(r":?-+:?", cell.strip())]
        elif not stripped or stripped.startswith("#"):
            close()
        else:
            if LIST_ITEM.match(line):
                close()
            block.append(line)
    close()
    return paragraphs, cells


def words(text: str) -> int:
    return len(text.split())


def sentences(paragraph: str) -> list[str]:
    for abbreviation in ABBREVIATIONS:
        paragraph = paragraph.replace(abbreviation + " ", abbreviation.replace(".", "") + " ")
    return [s for s in SENTENCE_END.split(paragraph) if s.strip()]


def style_problems(text: str) -> list[str]:
    """What breaks the rules in a markdown text; empty when it keeps them."""
    paragraphs, cells = prose(text)
    problems = [f"paragraph of {words(p)} words: {p[:60]}..." for p in paragraphs
                if words(p) > MAX_PARAGRAPH_WORDS]
    problems += [f"table cell of {words(c)} words: {c[:60]}..." for c in cells
                 if words(c) > MAX_CELL_WORDS]
    every = [s for p in paragraphs for s in sentences(p)]
    long = [s for s in every if words(s) > LONG_SENTENCE_WORDS]
    if every and len(long) / len(every) >= MAX_LONG_SENTENCE_SHARE:
        problems.append(f"{len(long)} of {len(every)} sentences run over {LONG_SENTENCE_WORDS} "
                        f"words (the limit is a share under {MAX_LONG_SENTENCE_SHARE:.0%}), "
                        f"e.g. {long[0][:80]}...")
    return problems


def test_readme_keeps_the_style_rules(repo_root: pathlib.Path) -> None:
    assert style_problems((repo_root / "README.md").read_text(encoding="utf-8")) == []


def test_scripts_readme_keeps_the_style_rules(repo_root: pathlib.Path) -> None:
    assert style_problems((repo_root / "scripts" / "README.md").read_text(encoding="utf-8")) == []


def test_the_style_check_catches_what_it_should() -> None:
    long_paragraph = " ".join(["word"] * 81) + "."
    assert style_problems(long_paragraph)
    assert style_problems("| " + " ".join(["word"] * 81) + " | b |\n|---|---|\n")
    assert not style_problems("| " + " ".join(["word"] * 80) + " | b |\n|---|---|\n")
    long_sentence = " ".join(["word"] * 26) + "."
    assert style_problems("\n\n".join([long_sentence, "Short one.", "Another one.", "A third."]))
    assert not style_problems("\n\n".join([long_sentence] + ["Short one."] * 5))
    # Code fences, headings and comments are not prose; list items are paragraphs of their own.
    fenced = "```\n" + " ".join(["code"] * 100) + "\n```\n"
    assert not style_problems(fenced + "# " + " ".join(["head"] * 100) + "\n")
    items = "\n".join("- " + " ".join(["item"] * 20) + "." for _ in range(5))
    assert len(prose(items)[0]) == 5 and not style_problems(items)
    assert sentences("It works, e.g. here. Next one.") == ["It works, eg here.", "Next one."]


def test_the_old_readme_fails_the_style_rules() -> None:
    """The rules would have caught the README this issue replaced (its figures in the module
    docstring), kept here in miniature: one 'Other scripts' block and one long sentence."""
    old = ("Other scripts: " + ", ".join(f"`scripts/s{i}.sh` (what it does, where it writes)"
                                         for i in range(40)) + ".")
    problems = style_problems(old)
    assert any(problem.startswith("paragraph of") for problem in problems)
    assert any("sentences run over" in problem for problem in problems)
