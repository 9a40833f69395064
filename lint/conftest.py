"""The lint step of scripts/test.sh: checks of the code's and the docs' style (class size, Notes,
commit subjects, figures in comments, the READMEs' prose), run apart from the test suite."""

from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def repo_root() -> pathlib.Path:
    """The checkout being linted."""
    return ROOT
