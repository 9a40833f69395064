"""Errors a rank raises when the world around it fails or disagrees."""

from __future__ import annotations

import re

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


def without_backtrace(err: BaseException) -> str:
    """The error's text without the C++ backtrace lines c10 appends."""
    return _BACKTRACE.sub("", str(err)).rstrip()
