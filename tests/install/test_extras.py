"""The extras in setup.cfg never replace the user's torch: commsched's extension is built
against the torch installed, and a package that pins one torch release (torchvision,
torchaudio) would make pip install another beside it, after which the extension no longer
loads (examples/README.md, "ResNet-50 without torchvision")."""

from __future__ import annotations

import configparser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
PINS_TORCH = {"torch", "torchvision", "torchaudio", "torchtext"}


def _extras() -> dict[str, list[Requirement]]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg", encoding="utf-8")
    section = cfg["options.extras_require"]
    return {extra: [Requirement(line) for line in section[extra].splitlines() if line.strip()]
            for extra in section}


def test_no_extra_can_replace_the_installed_torch() -> None:
    extras = _extras()
    assert {"examples", "lightning", "horovod"} <= set(extras), extras
    for extra, requirements in extras.items():
        names = {canonicalize_name(r.name) for r in requirements}
        assert not names & PINS_TORCH, (extra, sorted(names & PINS_TORCH))
