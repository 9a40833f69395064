"""Files that commands and knobs write (reports, plots, profiles, timelines): their folders are
made and their places checked before any work starts, so a bad path costs one clear line, not
a finished training run."""

from __future__ import annotations

import os
import tempfile


class OutputPathError(ValueError):
    """An output path that cannot be written; the message is one line naming what and where."""


def prepare_dir(path: str, what: str) -> str:
    """Creates `path` (and its parents) and checks that a file can be made in it."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise OutputPathError(f"{what} {path}: cannot write there ({err.strerror or err})") \
            from None
    return path


def prepare_file(path: str, what: str) -> str:
    """Creates the folder `path` goes in and checks that `path` itself can be written, leaving
    no file behind when there was none."""
    if os.path.isdir(path):
        raise OutputPathError(f"{what} {path}: is a directory, not a file name")
    existed = os.path.exists(path)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as err:
        raise OutputPathError(f"{what} {path}: cannot write there ({err.strerror or err})") \
            from None
    if not existed:
        os.remove(path)
    return path
