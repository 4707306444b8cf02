"""Pure: what an `LLMTenant`'s status says, from what the router knows of it: whether the
router can use the object, which of its keys clash with another tenant's or expire soon, which
of its models no LLMDeployment serves, whether its priority class exists, and the month's usage
from the shared store.

The router writes it (`gateway` asks, `kube.patch_status` sends) because the router is
where keys are looked up and tokens counted; every router pod computes the same answer from the
same objects and the same store, so their writes agree.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from llmop_router.priorities import Classes
from llmop_router.quota import PICO
from llmop_router.tenants import Directory, Tenant

EXPIRING_SECONDS = 7 * 86_400
"""A key that stops working within this is reported (KeyExpiringSoon)."""
READY = "Ready"
DUPLICATE_KEY_HASH = "DuplicateKeyHash"
KEY_EXPIRING_SOON = "KeyExpiringSoon"
UNKNOWN_MODELS = "UnknownModels"
UNKNOWN_PRIORITY_CLASS = "UnknownPriorityClass"


def _time(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def conditions_of(
    name: str,
    directory: Directory,
    problem: str | None,
    routed: Iterable[str],
    now: float,
    *,
    classes: Classes | None = None,
) -> list[tuple[str, bool, str, str]]:
    """(type, status, reason, message) of each condition, in a fixed order."""
    tenant = directory.tenants.get(name)
    if tenant is None:
        why = problem or "the router has not read this LLMTenant"
        return [(READY, False, "Invalid", why)]
    found: list[tuple[str, bool, str, str]] = [
        (READY, True, "Serving", f"{len(tenant.keys)} key(s); the router admits them")
    ]
    clashes = [
        f"{key.name} (also in {', '.join(o for o in directory.clashes[key.sha256] if o != name)})"
        for key in tenant.keys
        if key.sha256 in directory.clashes
    ]
    found.append(
        (DUPLICATE_KEY_HASH, True, "KeyHashClaimedTwice", "refused: " + "; ".join(clashes))
        if clashes
        else (DUPLICATE_KEY_HASH, False, "Unique", "no other LLMTenant lists these keys")
    )
    soon = [
        f"{key.name} at {_time(key.not_after)}"
        for key in tenant.keys
        if key.not_after is not None
        and not key.disabled
        and now <= key.not_after <= now + EXPIRING_SECONDS
    ]
    found.append(
        (KEY_EXPIRING_SOON, True, "Rotate", "add a new key, then remove: " + ", ".join(soon))
        if soon
        else (KEY_EXPIRING_SOON, False, "NoneSoon", "no key expires within 7 days")
    )
    missing = unknown_models(tenant, routed)
    found.append(
        (
            UNKNOWN_MODELS,
            True,
            "NotServed",
            "no LLMDeployment serves: " + ", ".join(missing) + " (check spec.models)",
        )
        if missing
        else (UNKNOWN_MODELS, False, "AllServed", "every model listed is served or a pattern")
    )
    if classes is not None:
        found.append(_class_condition(tenant, classes))
    return found


def _class_condition(tenant: Tenant, classes: Classes) -> tuple[str, bool, str, str]:
    if classes.missing(tenant.priority_class):
        name = classes.default.name
        fallback = f"LLMPriorityClass {name!r}" if name else "the built-in default (value 0)"
        return (
            UNKNOWN_PRIORITY_CLASS,
            True,
            "NotFound",
            f"no LLMPriorityClass {tenant.priority_class!r}: its requests get {fallback} "
            "(create the class or fix spec.priorityClassName)",
        )
    used = classes.of_tenant(tenant.priority_class)
    return (
        UNKNOWN_PRIORITY_CLASS,
        False,
        "Found",
        f"its requests get LLMPriorityClass {used.name!r}"
        if used.name
        else "its requests get the built-in default class (value 0)",
    )


def unknown_models(tenant: Tenant, routed: Iterable[str]) -> list[str]:
    """Names (not patterns) of `spec.models` no routed model matches."""
    served = list(routed)
    plain = [m for m in tenant.models if not any(c in m for c in "*?[")]
    return [m for m in plain if not any(fnmatch.fnmatchcase(s, m) for s in served)]


def usage_of(month: str, fields: Mapping[str, int]) -> dict[str, Any]:
    """`status.usage` from the store's usage hash of the month."""
    totals = {"in": 0, "cached": 0, "out": 0}
    for field, value in fields.items():
        model, _, kind = field.rpartition(":")
        if model != "total" and kind in totals:
            totals[kind] += value
    cost = Decimal(fields.get("total:picos", 0)) / PICO
    return {
        "month": month,
        "inputTokens": totals["in"],
        "cachedInputTokens": totals["cached"],
        "outputTokens": totals["out"],
        "cost": f"{cost.quantize(Decimal('0.000001'))}",
    }


def status_patch(
    conditions: list[tuple[str, bool, str, str]],
    previous: Iterable[Mapping[str, Any]],
    usage: dict[str, Any] | None,
    now: float,
) -> dict[str, Any]:
    """The status to write: each condition keeps its `lastTransitionTime` while its status
    stays."""
    before = {c.get("type"): c for c in previous}
    written = []
    for kind, holds, reason, message in conditions:
        value = "True" if holds else "False"
        old = before.get(kind) or {}
        since = old.get("lastTransitionTime") if old.get("status") == value else None
        written.append(
            {
                "type": kind,
                "status": value,
                "reason": reason,
                "message": message[:1024],
                "lastTransitionTime": since or _time(now),
            }
        )
    status: dict[str, Any] = {"conditions": written}
    if usage is not None:
        status["usage"] = usage
    return {"status": status}
