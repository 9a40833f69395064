import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SUITES = ("unit", "dist", "e2e")
sys.path.insert(0, HERE)
# The benchmark harnesses (benchmarks/harness) are no part of the installed package: they import
# from the checkout, as `python -m benchmarks.harness.<name>` does from the repository root.
# Appended, so that the commsched under test stays the one the environment installed.
sys.path.append(os.path.dirname(HERE))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A whole-suite run must collect tests from every suite folder: a folder silently skipped
    (pytest ignores folders named 'dist' unless told otherwise) would hide missing coverage."""
    whole_suite = all(os.path.abspath(arg) == HERE for arg in config.args) and \
        not config.getoption("keyword") and not config.getoption("markexpr")
    if not whole_suite:
        return
    seen = {os.path.relpath(str(item.path), HERE).split(os.sep)[0] for item in items}
    missing = [suite for suite in SUITES if suite not in seen]
    if missing:
        raise pytest.UsageError(f"no tests collected from tests/{', tests/'.join(missing)}")
