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
    """A collective failed or timed out: another rank died, hung, left or fell behind.

    Every waiting rank raises it within COMMSCHED_TIMEOUT plus a few seconds, from step(),
    synchronize(), flush() and the other calls that wait. The message starts with the ranks
    that hold this one up and how, from the heartbeats (world.liveness.diagnose): exited,
    silent, left, or alive but stuck (its iteration against the others', its phase and for how
    long, the gradients it has not handed over), then the blocks this rank was waiting for
    (docs/failures.md). In an elastic Horovod job it is also Horovod's HorovodInternalError, so
    ``hvd.elastic.run`` restores the last commit and commsched re-forms its world.
    """


class MismatchError(RuntimeError):
    """Ranks disagree on something that must be identical, found before it could hang them.

    Raised on every rank at once: at wrap time when the ranks wrap different parameters (names,
    shapes, dtypes) or settings, and before a plan runs when their plans' fingerprints differ
    (a restored plan, K-FAC's factor plan included). The message names the first difference
    and the rank that has it.
    """


class LauncherError(RuntimeError):
    """The launcher's variables say more than one process, but no world can be formed from them.

    Raised by init() (and so by a wrap) instead of training as a world of one: a launcher's
    variables are incomplete or out of range, a Slurm allocation's shell is not one of srun's
    tasks, or the ranks span several hosts and no rendezvous address is known. The message
    names the variables that were read and what to set (docs/usage.md, "Launchers").
    """


HOROVOD_INSTALL = ("install it with scripts/install_horovod.sh (in commsched's source tree), "
                   "see docs/install.md")


class HorovodMissingError(ImportError):
    """Horovod is needed (a horovodrun job, a Horovod benchmark candidate) but cannot be imported.

    Either it is not installed (it is the optional extra ``horovod``: scripts/install_horovod.sh,
    then ``pip install --no-build-isolation '.[horovod]'``), or it was
    built against another torch.
    """


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
    """Whether this process is a worker of an elastic horovodrun job.

    That is ``--min-np``/``--max-np`` or a host-discovery script: horovodrun sets
    HOROVOD_ELASTIC=1 for its workers.
    """
    return os.environ.get("HOROVOD_ELASTIC") == "1"


_elastic_failure: type[RankFailureError] | None = None


def failure_type() -> type[RankFailureError]:
    """The class of the error a failed collective raises.

    In an elastic Horovod job it is also Horovod's HorovodInternalError: ``hvd.elastic.run``
    catches that one, restores the last commit and resets, and commsched re-forms its world at
    the next step (see Note [Elastic Horovod] in world/bootstrap.py).
    """
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
