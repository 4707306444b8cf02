"""Pure: Kubernetes resource quantities (`64Gi`, `500M`, `1.5Gi`, `2e9`) as numbers."""

from __future__ import annotations

import re

GIB = 1024**3

_SUFFIX: dict[str, float] = {
    "": 1,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
    "Ei": 1024**6,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "m": 1e-3,
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?([a-zA-Z]{0,2})$")


def quantity_value(quantity: int | str) -> float | None:
    """The quantity's value in base units (bytes for memory); None when it does not parse."""
    if isinstance(quantity, int):
        return float(quantity)
    match = _QUANTITY.match(quantity.strip())
    if match is None or match.group(3) not in _SUFFIX:
        return None
    number, exponent, suffix = match.groups()
    value = float(number) * 10 ** int(exponent or 0)
    return float(value * _SUFFIX[suffix])


def quantity_gib(quantity: int | str | None) -> float | None:
    """A memory quantity in GiB, or None when absent or unparsable."""
    if quantity is None:
        return None
    value = quantity_value(quantity)
    return None if value is None else value / GIB
