"""Errors a rank raises when the world around it fails or disagrees."""

from __future__ import annotations

import importlib
import os
import re
from types import ModuleType

# c10::Error's text carries the C++ backtrace of where it was raised: for a failed collective
# that is the engine's completion thread inside c10d, which says nothing to the user.
_BACKTRACE = re.compile(r"^(Exception raised from .*\(most recent call first\):|frame #\d+: .*)\n?",
                        re.MULTILINE)


class RankFailureError(RuntimeError):
    """A collective failed or timed out. The message starts with the ranks that hold this one up
    and how, from the heartbeats (world.liveness.diagnose): silent, left, or alive but stuck
    (its iteration against the others', its phase and for how long, the gradients it has not
    handed over), then the blocks this rank was waiting for."""


class MismatchError(RuntimeError):
    """Ranks disagree on something that must be identical."""


HOROVOD_INSTALL = ("install it with scripts/install_horovod.sh (in commsched's source tree), "
                   "see docs/install.md")


class HorovodMissingError(ImportError):
    """Horovod is needed (a horovodrun job, a Horovod benchmark candidate) but cannot be imported:
    not installed (it is the optional extra ``commsched[horovod]``), or built against another
    torch."""


def import_horovod(needed_for: str, module: str = "horovod.torch") -> ModuleType:
    """The one place commsched imports Horovod, so that its absence always reads the same.

    Args:
        needed_for: why Horovod is needed, completing "commsched: ... but horovod is not
            importable", e.g. "this process was started by horovodrun (HOROVOD_RANK is set)".
        module: the Horovod module to import.

    Returns:
        The imported module.

    Raises:
        HorovodMissingError: `module` cannot be imported; the message says why it was needed,
            what the import said, and how to install Horovod.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise HorovodMissingError(f"commsched: {needed_for} but horovod is not importable "
                                  f"({module}: {err}): {HOROVOD_INSTALL}") from err


def without_backtrace(err: BaseException) -> str:
    """The error's text without the C++ backtrace lines c10 appends."""
    return _BACKTRACE.sub("", str(err)).rstrip()


def elastic() -> bool:
    """Whether this process is a worker of an elastic horovodrun job (``--min-np``/``--max-np``
    or a host-discovery script): horovodrun sets HOROVOD_ELASTIC=1 for its workers."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"


_elastic_failure: type[RankFailureError] | None = None


def failure_type() -> type[RankFailureError]:
    """The class of the error a failed collective raises. In an elastic Horovod job it is also
    Horovod's HorovodInternalError: ``hvd.elastic.run`` catches that one, restores the last
    commit and resets, and commsched re-forms its world at the next step (see Note [Elastic
    Horovod] in world/bootstrap.py)."""
    global _elastic_failure
    if not elastic():
        return RankFailureError
    if _elastic_failure is None:
        exceptions = import_horovod("this process is a worker of an elastic horovodrun job "
                                    "(HOROVOD_ELASTIC=1)", "horovod.common.exceptions")
        _elastic_failure = type("ElasticRankFailureError",
                                (RankFailureError, exceptions.HorovodInternalError),
                                {"__module__": __name__, "__doc__": RankFailureError.__doc__})
    return _elastic_failure
