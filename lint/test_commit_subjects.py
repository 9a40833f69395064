"""Commit subjects of at most 72 characters, the detail in the body (issue 56, item 4), from the
first commit of issue 54 on: `git log` wraps nothing, and a one-line log stays one line each."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The first commit made under the rule (issue 54's GradScaler recipes); older subjects predate it.
FIRST_UNDER_THE_RULE = "a4d5073"
MAX_SUBJECT = 72


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_commit_subjects_fit_in_72_characters() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no history to read")
    if _git("cat-file", "-e", f"{FIRST_UNDER_THE_RULE}^{{commit}}").returncode != 0:
        pytest.skip(f"a shallow history without {FIRST_UNDER_THE_RULE}")
    log = _git("log", "--format=%h %s", f"{FIRST_UNDER_THE_RULE}^..HEAD")
    assert log.returncode == 0, log.stderr
    long = [line for line in log.stdout.splitlines()
            if len(line.split(" ", 1)[1]) > MAX_SUBJECT]
    assert not long, (f"commit subjects over {MAX_SUBJECT} characters (put the detail in the "
                      "body):\n" + "\n".join(long))
