"""Pure: `LLMPriorityClass` objects → the terms a tenant's requests wait under when a model is
saturated (docs/gateway.md, "Priority and fair sharing").

A class has a value (higher is served first), may be sheddable (refused at once while the model
is saturated), may hold at most a share of a model's slots (so higher classes find one free),
and bounds its own queue (how long a request may wait, how many may wait). A tenant names its
class (`spec.priorityClassName`); one that names none gets the class marked `globalDefault`
(the one of lowest value if several are), else the built-in default: value 0, not sheddable,
every slot, the router's own queue bounds. A tenant naming a class that does not exist gets the
default too, and its status says so. A request may move to a class of lower or equal value with
the `X-Llmop-Priority-Class` header, never to a higher one.

The same parser reads the watched CRs and `--static-tenants` files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from llmop_router import contract
from llmop_router.contract import PriorityClassSpec as S


class PriorityClassError(ValueError):
    """An `LLMPriorityClass` the router cannot use: the message names the field and the fix."""


@dataclass(frozen=True)
class PriorityClass:
    name: str
    value: int = 0
    sheddable: bool = False
    max_share_percent: int = 100
    """The most of a model's slots its requests may hold at once, in percent."""
    max_wait_seconds: float | None = None
    """None: the router's `--queue-wait-seconds`."""
    max_requests: int | None = None
    """Its requests waiting at once on a router pod; None: only the pod's own caps."""
    global_default: bool = False

    def slots_of(self, slots: int) -> int:
        """The class's slots of `slots` (at least one, so a class is never shut out)."""
        return max(1, slots * self.max_share_percent // 100)


DEFAULT = PriorityClass(name="")
"""Tenants' class when they name none and no class is the global default."""


@dataclass(frozen=True)
class Classes:
    """Every class by name, and the default."""

    by_name: Mapping[str, PriorityClass]
    default: PriorityClass = DEFAULT

    @classmethod
    def of(cls, classes: Iterable[PriorityClass]) -> Classes:
        by_name = {c.name: c for c in classes}
        defaults = sorted((c for c in by_name.values() if c.global_default), key=_lowest_first)
        return cls(by_name, defaults[0] if defaults else DEFAULT)

    def of_tenant(self, name: str | None) -> PriorityClass:
        """The class a tenant's requests get (`spec.priorityClassName`)."""
        if name is None:
            return self.default
        return self.by_name.get(name, self.default)

    def missing(self, name: str | None) -> bool:
        """Whether a tenant names a class that does not exist."""
        return name is not None and name not in self.by_name

    def lowered(self, current: PriorityClass, asked: str) -> PriorityClass | str:
        """The class a request asks for by name, when its value is at most `current`'s; else
        why not (the header's 400)."""
        found = self.by_name.get(asked)
        if found is None:
            return f"no LLMPriorityClass is named {asked!r}"
        if found.value > current.value:
            return (
                f"LLMPriorityClass {asked!r} (value {found.value}) is above the tenant's "
                f"{current.name or 'default'!r} (value {current.value}): a request may only "
                "lower its priority"
            )
        return found


def _lowest_first(c: PriorityClass) -> tuple[int, str]:
    return c.value, c.name


def _whole(raw: Mapping[str, Any], key: str, where: str, low: int, high: int) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise PriorityClassError(f"{where}.{key} must be a whole number from {low} to {high}")
    return value


def parse_priority_class(document: Mapping[str, Any]) -> PriorityClass:
    """An `LLMPriorityClass` object (as the API serves it, or as a static file holds it)."""
    metadata = document.get("metadata") or {}
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        raise PriorityClassError("LLMPriorityClass: metadata.name must name the class")
    spec = document.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise PriorityClassError(f"LLMPriorityClass {name}: spec must be an object")
    try:
        return _parse_spec(name, spec)
    except PriorityClassError as exc:
        raise PriorityClassError(f"LLMPriorityClass {name}: {exc}") from None


def _parse_spec(name: str, spec: Mapping[str, Any]) -> PriorityClass:
    queue = spec.get(S.QUEUE)
    queue = {} if queue is None else queue
    if not isinstance(queue, Mapping):
        raise PriorityClassError(f"spec.{S.QUEUE} must be an object")
    value = _whole(spec, S.VALUE, "spec", contract.MIN_PRIORITY, contract.MAX_PRIORITY)
    share = _whole(spec, S.MAX_SHARE_PERCENT, "spec", 1, 100)
    where = f"spec.{S.QUEUE}"
    wait = _whole(queue, S.MAX_WAIT_SECONDS, where, 1, contract.MAX_QUEUE_WAIT_SECONDS)
    requests = _whole(queue, S.MAX_REQUESTS, where, 1, contract.MAX_QUEUED_REQUESTS)
    for flag in (S.SHEDDABLE, S.GLOBAL_DEFAULT):
        if not isinstance(spec.get(flag, False), bool):
            raise PriorityClassError(f"spec.{flag} must be true or false")
    return PriorityClass(
        name=name,
        value=0 if value is None else value,
        sheddable=spec.get(S.SHEDDABLE) is True,
        max_share_percent=100 if share is None else share,
        max_wait_seconds=None if wait is None else float(wait),
        max_requests=requests,
        global_default=spec.get(S.GLOBAL_DEFAULT) is True,
    )
