"""docs/architecture.md, "What happens to one gradient": the Python files whose code runs in one
steady iteration are the ones its lists name, traced with sys.setprofile in a world of one that
keeps stepping through the engine (as a world with peers does)."""

from __future__ import annotations

import pathlib
import re
import sys
from types import FrameType
from typing import Any

import pytest
import torch
from torch import nn

import commsched

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "commsched"


def _documented(heading: str) -> set[str]:
    """The files listed under the "Files (n):" line of the section whose heading starts so."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text[text.index(heading):]
    listing = section[section.index("Files ("):]
    count = int(re.match(r"Files \((\d+)\):", listing).group(1))  # type: ignore[union-attr]
    files = re.findall(r"^- `(commsched/[\w/]+\.py)`$", listing.split("\n\n", 2)[1], re.M)
    assert len(files) == count, (heading, files)
    return set(files)


def _traced(policy: str) -> set[str]:
    commsched.init()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt: Any = commsched.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters(),
        model=model, policy=policy)
    opt.session.never_pass_through()

    def iteration() -> None:
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()

    for _ in range(200):
        iteration()
        if opt.plan_settled and not opt.session.engine.sampling:
            break
    assert opt.plan_settled and not opt.session.engine.sampling
    files: set[str] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        path = pathlib.Path(frame.f_code.co_filename)
        if event == "call" and path.is_relative_to(PACKAGE):
            files.add(path.relative_to(ROOT).as_posix())

    sys.setprofile(profile)
    try:
        iteration()
    finally:
        sys.setprofile(None)
    return files


@pytest.mark.parametrize(("policy", "heading"), [
    ("horovod", "### Under a synchronous plan"), ("dear", "### Under an overlap plan")])
def test_one_iteration_runs_the_files_the_architecture_names(policy: str, heading: str) -> None:
    assert _traced(policy) == _documented(heading)
