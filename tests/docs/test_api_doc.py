"""docs/api.md (issue 54, item 6) lists the whole public surface, and each entry is documented.

A name counts as listed when it appears inside an inline code span of the page (`init()`,
`Compression.none`); the wrapped optimizer's methods must appear in its own section, where a
bare `step()` cannot be confused with K-FAC's. The docstrings themselves are checked by ruff's D
rules (scripts/test.sh), except where ruff cannot see them: the wrapper's class is private, so
its methods are checked here, and so is StallWarning, whose module is not under the D rules.
"""

from __future__ import annotations

import enum
import inspect
import pathlib
import re

import commsched
from commsched.__main__ import USAGE
from commsched.kfac import KFACPreconditioner
from commsched.optimizer import _DistributedOptimizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "api.md"
WRAPPER_HEADING = "## The wrapped optimizer"
KFAC_HEADING = "## K-FAC"


def code_names(text: str) -> set[str]:
    """Every identifier (dotted parts included) that appears inside an inline code span."""
    names: set[str] = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        names.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span))
    return names


def section(text: str, heading: str) -> str:
    """The part of `text` from the line `heading` to the next heading of the same level."""
    start = text.index("\n" + heading + "\n")
    end = text.find("\n## ", start + len(heading) + 2)
    return text[start:] if end < 0 else text[start:end]


def public_members(cls: type) -> list[str]:
    """The public methods and properties `cls` defines itself (not those it inherits)."""
    return sorted(name for name, value in vars(cls).items()
                  if not name.startswith("_")
                  and (inspect.isfunction(value) or isinstance(value, property)))


def own_doc(value: object) -> str:
    """The docstring written for `value` itself: a property's getter's, a function's own."""
    if isinstance(value, property):
        value = value.fget
    return (getattr(value, "__doc__", None) or "").strip()


def test_every_name_of_all_is_listed() -> None:
    listed = code_names(API.read_text(encoding="utf-8"))
    missing = sorted(set(commsched.__all__) - listed)
    assert not missing, f"docs/api.md does not list {missing} (commsched.__all__)"


def test_every_public_method_of_the_wrapper_is_listed_in_its_section() -> None:
    members = public_members(_DistributedOptimizer)
    # The brief's list, so that a rename cannot empty the check.
    assert {"synchronize", "skip_synchronize", "no_sync", "flush", "step", "zero_grad",
            "state_dict", "load_state_dict", "set_backward_passes_per_step", "plan",
            "auto"} <= set(members)
    listed = code_names(section(API.read_text(encoding="utf-8"), WRAPPER_HEADING))
    missing = [name for name in members if name not in listed]
    assert not missing, f"docs/api.md, '{WRAPPER_HEADING}', does not list {missing}"


def test_every_public_method_of_the_kfac_preconditioner_is_listed_in_its_section() -> None:
    listed = code_names(section(API.read_text(encoding="utf-8"), KFAC_HEADING))
    missing = [name for name in ["KFACPreconditioner", *public_members(KFACPreconditioner)]
               if name not in listed]
    assert not missing, f"docs/api.md, '{KFAC_HEADING}', does not list {missing}"


def test_every_command_of_python_m_commsched_is_listed() -> None:
    match = re.search(r"\{([a-z,]+)\}", USAGE)
    assert match is not None, USAGE
    text = API.read_text(encoding="utf-8")
    missing = [c for c in match.group(1).split(",") if f"`python -m commsched {c}" not in text]
    assert not missing, f"docs/api.md does not list `python -m commsched` {missing}"


def test_the_public_names_and_the_wrapper_methods_have_docstrings() -> None:
    undocumented = []
    for name in commsched.__all__:
        value = getattr(commsched, name)
        if isinstance(value, enum.Enum):  # Average, Sum, Adasum: ReduceOp's doc says them
            value = type(value)
        if not own_doc(value) or (isinstance(value, type) and "__doc__" not in vars(value)):
            undocumented.append(name)
    for cls in (_DistributedOptimizer, KFACPreconditioner):
        undocumented += [f"{cls.__name__}.{name}" for name in public_members(cls)
                         if not own_doc(vars(cls)[name])]
    assert not undocumented, f"no docstring of their own: {undocumented}"


def test_the_links_of_the_page_lead_to_files() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", API.read_text(encoding="utf-8"))
    assert links
    broken = [link for link in links if not (API.parent / link).resolve().exists()]
    assert not broken, f"docs/api.md links to missing files: {broken}"
