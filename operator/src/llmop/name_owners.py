"""Pure: who owns each model name served through the shared router (issue 49 item 5).

Every routed LLMDeployment claims model names: `spec.model.servedName` (else its own name) and
each `spec.adapters[].name`. Two CRs may claim one name; one owns it, the others are refused
(`Degraded` reason `ModelNameConflict`, naming the owner); one whose `spec.router.fallback`
names a model no other routed CR serves is told so too (`FallbackNotRouted`). The rule,
deterministic on every replica and stable across the owner being recreated:

1. A name with a recorded owner stays that owner's while it claims the name.
2. When the owner is gone (deleted; a GitOps replace deletes and recreates it), the name stays
   reserved to it for `grace` (a setting, 10 min by default): a recreated CR of the same
   namespace/name takes it back; nobody else gets it meanwhile. An owner that still exists but
   no longer claims the name (renamed, routing off) lets it go at once: that was deliberate.
3. A free name goes to its first claimant: the earliest `creationTimestamp`, ties by
   namespace/name.

The record (served name → owner, and since when the owner is absent) is kept by the operator in
one ConfigMap it owns (`llmop.name_check`), so a restarted or newly elected operator keeps it.
It writes only when an owner changes or goes missing, never on a timer. Its size is bounded by
`MAX_NAMES`: past it the names of absent owners are forgotten first (oldest absence first), and a
name not recorded is decided by rule 3 from the CRs alone.

A CR outside the namespaces allowed to serve through the router (`servingNamespaces`; empty: all)
claims nothing and is told so (`NamespaceNotServed`). Time is a parameter here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from llmop import conditions
from llmop.names import record_config_map
from llmop.pods import PodIssue
from llmop_router import contract as router_contract

Key = tuple[str, str]
"""A CR's (namespace, name)."""

CONFIG_MAP_NAME = "llmop-served-names"
"""The ConfigMap (in the operator's namespace) that records the owners."""
DATA_KEY = "owners.json"
"""Its one data key: `{served name: {"namespace", "name", "absentSince"?}}` (a served name may
hold `/`, which a ConfigMap key may not, so the record is one JSON document)."""
MAX_NAMES = 1000
"""Recorded names at most: a served name (≤ 253 characters), a namespace and name and a time
make at most about 600 bytes of JSON, so the ConfigMap stays well under its 1 MiB limit."""
REASONS = (
    conditions.REASON_MODEL_NAME_CONFLICT,
    conditions.REASON_NAMESPACE_NOT_SERVED,
    conditions.REASON_FALLBACK_NOT_ROUTED,
)
"""The `Degraded` reasons this module decides."""
DEFAULT_GRACE_SECONDS = 600.0
"""How long a name stays reserved to an owner that went missing."""


@dataclass(frozen=True)
class Claimant:
    """A routed CR and the model names it claims."""

    namespace: str
    name: str
    created: str
    """Its `metadata.creationTimestamp` (RFC 3339, so it sorts as text)."""
    names: tuple[str, ...]
    fallbacks: tuple[str, ...] = ()
    """The routed models its `spec.router.fallback` names (`model`)."""
    external_fallbacks: tuple[str, ...] = ()
    """The `LLMExternalModel`s its `spec.router.fallback` names (`externalModel`)."""

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class Owner:
    """A recorded owner of a name; `absent_since` is set while no CR of that name claims it."""

    namespace: str
    name: str
    absent_since: datetime | None = None

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


Record = Mapping[str, Owner]


@dataclass(frozen=True)
class Verdict:
    """What one CR is told: the names it owns, the ones it lost (name → owner), and whether its
    namespace may serve through the router at all."""

    owned: tuple[str, ...] = ()
    lost: tuple[tuple[str, Owner], ...] = ()
    namespace_served: bool = True
    unknown_fallbacks: tuple[str, ...] = ()
    """Models its `spec.router.fallback` names that no other routed CR serves now."""
    unknown_externals: tuple[str, ...] = ()
    """`LLMExternalModel`s its `spec.router.fallback` names that do not exist in the router's
    namespace (checked only while they can be listed)."""


@dataclass(frozen=True)
class Decision:
    record: dict[str, Owner] = field(default_factory=dict)
    verdicts: dict[Key, Verdict] = field(default_factory=dict)


def claimant_of(llmd: Mapping[str, Any]) -> Claimant | None:
    """The names a CR claims (its served name, then its adapters'), or None (routing off)."""
    meta = llmd.get("metadata") or {}
    spec = llmd.get("spec") or {}
    spec_keys = router_contract.Spec
    if (spec.get(spec_keys.ROUTER) or {}).get(spec_keys.ENABLED) is False:
        return None
    namespace, name = meta.get("namespace"), meta.get("name")
    if not namespace or not name:
        return None
    model = (spec.get(spec_keys.MODEL) or {}).get(spec_keys.SERVED_NAME) or name
    adapters = [
        str(a[spec_keys.ADAPTER_NAME])
        for a in spec.get(spec_keys.ADAPTERS) or []
        if isinstance(a, Mapping) and isinstance(a.get(spec_keys.ADAPTER_NAME), str)
    ]
    names = tuple(dict.fromkeys([str(model), *adapters]))
    router = spec.get(spec_keys.ROUTER) or {}
    fallbacks = tuple(
        dict.fromkeys(
            str(f[spec_keys.FALLBACK_MODEL])
            for f in router.get(spec_keys.FALLBACK) or []
            if isinstance(f, Mapping) and isinstance(f.get(spec_keys.FALLBACK_MODEL), str)
        )
    )
    externals = tuple(
        dict.fromkeys(
            str(f[spec_keys.FALLBACK_EXTERNAL_MODEL])
            for f in router.get(spec_keys.FALLBACK) or []
            if isinstance(f, Mapping) and isinstance(f.get(spec_keys.FALLBACK_EXTERNAL_MODEL), str)
        )
    )
    created = str(meta.get("creationTimestamp") or "")
    return Claimant(str(namespace), str(name), created, names, fallbacks, externals)


def decide(
    claimants: Iterable[Claimant],
    record: Record,
    *,
    present: Iterable[Key],
    now: datetime,
    grace: timedelta,
    serving_namespaces: Iterable[str] = (),
    externals: Iterable[str] | None = None,
) -> Decision:
    """The owners of every claimed name and each claimant's verdict (see the module's rule).
    `present` are all the CRs that exist (routed or not): an owner that exists but no longer
    claims a name lets it go at once. `externals`: the names of the `LLMExternalModel`s in the
    router's namespace (None: not known, and external fallbacks are not judged)."""
    known_externals = None if externals is None else frozenset(externals)
    allowed = frozenset(serving_namespaces)
    ordered = sorted(claimants, key=lambda c: (c.created, c.namespace, c.name))
    existing = set(present)
    served = [c for c in ordered if not allowed or c.namespace in allowed]
    by_name: dict[str, list[Claimant]] = {}
    for claimant in served:
        for name in claimant.names:
            by_name.setdefault(name, []).append(claimant)
    owners = _kept(record, by_name, existing, now=now, grace=grace)
    for name, claiming_crs in by_name.items():
        if name not in owners:
            first = claiming_crs[0]
            owners[name] = Owner(first.namespace, first.name)
    verdicts: dict[Key, Verdict] = {}
    for claimant in ordered:
        if claimant not in served:
            verdicts[claimant.key] = Verdict(namespace_served=False)
            continue
        owned = tuple(n for n in claimant.names if owners[n].key == claimant.key)
        lost = tuple((n, owners[n]) for n in claimant.names if owners[n].key != claimant.key)
        unknown = tuple(
            f
            for f in claimant.fallbacks
            if f not in owners
            or owners[f].absent_since is not None
            or owners[f].key == claimant.key
        )
        missing = (
            ()
            if known_externals is None
            else tuple(e for e in claimant.external_fallbacks if e not in known_externals)
        )
        verdicts[claimant.key] = Verdict(
            owned, lost, unknown_fallbacks=unknown, unknown_externals=missing
        )
    return Decision(_bounded(owners), verdicts)


def _kept(
    record: Record,
    by_name: Mapping[str, list[Claimant]],
    existing: set[Key],
    *,
    now: datetime,
    grace: timedelta,
) -> dict[str, Owner]:
    """Rules 1 and 2: the recorded owners that keep their names (present, or absent for less
    than `grace`)."""
    owners: dict[str, Owner] = {}
    for name, previous in record.items():
        claiming = {c.key for c in by_name.get(name, ())}
        if previous.key in claiming:
            owners[name] = Owner(previous.namespace, previous.name)
        elif previous.key in existing:
            continue  # it exists and let the name go (renamed, routing off): free at once
        else:
            since = previous.absent_since or now
            if now - since < grace:
                owners[name] = Owner(previous.namespace, previous.name, since)
    return owners


def _bounded(owners: dict[str, Owner]) -> dict[str, Owner]:
    """At most `MAX_NAMES` names: absent owners' forgotten first, the longest absent first."""
    if len(owners) <= MAX_NAMES:
        return owners
    absent = sorted(
        (n for n, o in owners.items() if o.absent_since is not None),
        key=lambda n: (owners[n].absent_since, n),
    )
    drop = set(absent[: len(owners) - MAX_NAMES])
    kept = {n: o for n, o in owners.items() if n not in drop}
    return dict(sorted(kept.items())[:MAX_NAMES])


def encode(record: Record) -> str:
    """The record as the ConfigMap's JSON (sorted: one text for one record)."""
    doc: dict[str, dict[str, str]] = {}
    for name, owner in sorted(record.items()):
        entry = {"namespace": owner.namespace, "name": owner.name}
        if owner.absent_since is not None:
            entry["absentSince"] = owner.absent_since.isoformat()
        doc[name] = entry
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def decode(text: str | None) -> dict[str, Owner]:
    """The record from the ConfigMap's JSON; entries that do not parse are dropped (a damaged
    record only loses reservations, rule 3 still decides)."""
    try:
        doc = json.loads(text or "{}")
    except ValueError:
        return {}
    found: dict[str, Owner] = {}
    if not isinstance(doc, dict):
        return found
    for name, entry in doc.items():
        if not isinstance(entry, dict):
            continue
        namespace, owner = entry.get("namespace"), entry.get("name")
        if not isinstance(namespace, str) or not isinstance(owner, str):
            continue
        since: datetime | None = None
        if isinstance(entry.get("absentSince"), str):
            try:
                since = datetime.fromisoformat(entry["absentSince"])
            except ValueError:
                since = None
        found[str(name)] = Owner(namespace, owner, since)
    return found


def config_map(namespace: str, record: Record) -> dict[str, Any]:
    """The ConfigMap that keeps the record."""
    return record_config_map(CONFIG_MAP_NAME, namespace, {DATA_KEY: encode(record)})


def conflict_message(lost: Iterable[tuple[str, Owner]], *, now: datetime, grace: timedelta) -> str:
    """The `ModelNameConflict` message: each lost name, its owner and the fix."""
    parts = []
    for name, owner in lost:
        if owner.absent_since is None:
            parts.append(f"model name {name!r} is served by LLMDeployment {owner}")
        else:
            until = owner.absent_since + grace
            left = max(0, int((until - now).total_seconds()))
            parts.append(
                f"model name {name!r} is reserved to LLMDeployment {owner}, which is gone, for "
                f"{left} s more (recreating it takes the name back)"
            )
    return (
        "; ".join(parts)
        + ". The router does not route it here: rename it (spec.model.servedName, or the "
        "adapter's spec.adapters[].name), or delete the owner."
    )


def not_served_message(namespace: str, allowed: Iterable[str]) -> str:
    """The `NamespaceNotServed` message."""
    return (
        f"Namespace {namespace} may not serve through the shared router (the chart's "
        f"router.servingNamespaces: {', '.join(sorted(allowed))}): the router does not route "
        "this model; its own Service still serves it. Ask the cluster admin to add the "
        "namespace, or set spec.router.enabled: false."
    )


def verdict_issue(
    verdict: Verdict,
    namespace: str,
    *,
    allowed: Iterable[str],
    now: datetime,
    grace: timedelta,
    external_namespace: str = "",
) -> PodIssue | None:
    """Why the router does not route (some of) a CR's names, as its `Degraded` says; None: it
    owns them all."""
    if not verdict.namespace_served:
        return PodIssue(
            conditions.REASON_NAMESPACE_NOT_SERVED, not_served_message(namespace, allowed), ""
        )
    if verdict.lost:
        return PodIssue(
            conditions.REASON_MODEL_NAME_CONFLICT,
            conflict_message(verdict.lost, now=now, grace=grace),
            "",
        )
    if verdict.unknown_fallbacks or verdict.unknown_externals:
        return PodIssue(
            conditions.REASON_FALLBACK_NOT_ROUTED,
            fallback_message(
                verdict.unknown_fallbacks,
                own=verdict.owned,
                externals=verdict.unknown_externals,
                external_namespace=external_namespace,
            ),
            "",
        )
    return None


def fallback_message(
    unknown: Iterable[str],
    *,
    own: Iterable[str],
    externals: Iterable[str] = (),
    external_namespace: str = "",
) -> str:
    """The `FallbackNotRouted` message: each fallback the router skips, and the fix."""
    unknown, externals, mine = tuple(unknown), tuple(externals), set(own)
    parts = [
        f"{name!r} is this LLMDeployment's own model"
        if name in mine
        else f"no LLMDeployment routed through the router serves {name!r}"
        for name in unknown
    ]
    where = f" in namespace {external_namespace!r}" if external_namespace else ""
    parts += [f"no LLMExternalModel {name!r}{where}" for name in externals]
    fixes = []
    if unknown or not externals:
        fixes.append("name another routed model's served name (kubectl get llmdeployments -A)")
    if externals:
        fixes.append(
            f"create the LLMExternalModel{where} (the router's: kubectl get llmexternalmodels"
            + (f" -n {external_namespace}" if external_namespace else "")
            + ")"
        )
    return (
        "spec.router.fallback: "
        + "; ".join(parts)
        + ". The router skips such a fallback (the model's own answer stands): "
        + ", or ".join(fixes)
        + ", or remove the entry."
    )


def seeded(record: Record, bodies: Iterable[Mapping[str, Any]]) -> dict[str, Owner]:
    """The record, with the names it lacks taken from the CRs' `status.routing.servedNames`
    (the earliest CR where two list one name): the decisions already published survive a lost
    ConfigMap, and an operator that kept no record before."""
    found = dict(record)
    status_keys = router_contract.Status
    listed: list[tuple[str, str, str, str]] = []
    for body in bodies:
        meta = body.get("metadata") or {}
        routing = (body.get("status") or {}).get(status_keys.ROUTING) or {}
        names = routing.get(status_keys.SERVED_NAMES) if isinstance(routing, Mapping) else None
        for name in names if isinstance(names, list) else []:
            created = str(meta.get("creationTimestamp") or "")
            listed.append((created, str(meta.get("namespace")), str(meta.get("name")), str(name)))
    for _created, namespace, owner, name in sorted(listed):
        found.setdefault(name, Owner(namespace, owner))
    return found
