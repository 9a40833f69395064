"""Bandwidth strings shared by the `simulate` and `report` commands ("10gbit", "1250mbit")."""

from __future__ import annotations

import re

_BITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_BYTES = {"bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9}


class UnitError(ValueError):
    pass


def parse_bandwidth(text: str) -> float:
    """Bytes per second from '10gbit', '1250mbit', '1.5gbit' (bits, as tc writes them) or
    '3gbps' (bytes per second, as tc reads 'bps')."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-zA-Z]+)\s*", str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _BITS | _BYTES:
        raise UnitError(f"bandwidth {text!r}: expected a number with a unit "
                        f"({', '.join(list(_BITS) + list(_BYTES))}), e.g. 10gbit")
    value = float(match.group(1))
    if value <= 0:
        raise UnitError(f"bandwidth {text!r}: must be > 0")
    return value * _BITS[unit] / 8 if unit in _BITS else value * _BYTES[unit] / 8
