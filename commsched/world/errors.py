"""Errors a rank raises when the world around it fails or disagrees."""

from __future__ import annotations


class RankFailureError(RuntimeError):
    """A collective failed or timed out; the message names the ranks that stopped responding
    (from the heartbeats) and the blocks this rank was waiting for."""


class MismatchError(RuntimeError):
    """Ranks disagree on something that must be identical."""
