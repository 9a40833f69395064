"""Result handling shared by the horovodrun jobs: one JSON file, written by rank 0, holding every
rank's outcome of every configuration."""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from typing import Any

import horovod.torch as hvd


def run_case(results: dict[str, Any], key: str, case: Callable[[], dict]) -> None:
    """Runs one configuration; an exception is recorded, and the other configurations still run."""
    try:
        results[key] = case()
    except Exception:
        results[key] = {"ok": False, "error": traceback.format_exc()}


def gather_and_write(results: dict[str, Any], path: str, name: str) -> None:
    gathered = hvd.allgather_object(results, name=name)
    if hvd.rank() == 0:
        merged = {key: {"ranks": [r[key] for r in gathered]} for key in results}
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"size": hvd.size(), "results": merged}, handle, indent=1)
