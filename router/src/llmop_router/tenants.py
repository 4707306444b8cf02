"""Pure: `LLMTenant` objects → who a presented API key is, and what that tenant may use.

A tenant's keys are stored only as SHA-256 hashes (`contract.api_key_hash`); a key is found by
its hash in one dict lookup. A key is refused when it is unknown, disabled, past its
`notAfter`, or claimed by more than one tenant (which of them would it be?). A tenant's
`models` are served names or globs (`*` every routed model); a model outside them is answered
exactly like a model that does not exist, so a key cannot probe what others serve.

The same parser reads the watched CRs and `--static-tenants` files, so a test's file is a CR.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from llmop_router import contract
from llmop_router.contract import TenantSpec as S


class TenantError(ValueError):
    """An `LLMTenant` the router cannot use: the message names the field and the fix."""


@dataclass(frozen=True)
class ApiKey:
    name: str
    sha256: str
    not_after: float | None = None
    """Unix seconds after which the key is refused (rotation by overlap)."""
    disabled: bool = False


@dataclass(frozen=True)
class Rates:
    """Per-minute limits of one scope (the tenant, or the tenant on one model); None: none."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    """Input and output tokens together."""
    output_tokens_per_minute: int | None = None

    def any(self) -> bool:
        return any(
            v is not None
            for v in (
                self.requests_per_minute,
                self.tokens_per_minute,
                self.output_tokens_per_minute,
            )
        )


@dataclass(frozen=True)
class ModelRates:
    model: str
    """A served name or a glob."""
    rates: Rates


@dataclass(frozen=True)
class Tenant:
    name: str
    keys: tuple[ApiKey, ...] = ()
    models: tuple[str, ...] = ("*",)
    rates: Rates = Rates()
    model_rates: tuple[ModelRates, ...] = ()
    max_concurrent_requests: int | None = None
    max_tokens_per_request: int | None = None
    reserve_output_tokens: int = contract.DEFAULT_RESERVE_OUTPUT_TOKENS
    burst_seconds: int = contract.DEFAULT_BURST_SECONDS
    shadow: bool = False
    """Count and report what would be refused, refuse nothing."""
    monthly_budget: Decimal | None = None
    """In the prices' currency, per calendar month (UTC)."""
    priority_class: str | None = None
    """Its `LLMPriorityClass` (None: the default class)."""
    weight: int = 1
    """Its share of a saturated model among the tenants of its class."""
    fallback: str = contract.FALLBACK_IN_CLUSTER_ONLY
    """Which fallbacks may answer it (`contract.FALLBACK_POLICIES`)."""

    def may_use(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, pattern) for pattern in self.models)

    def may_fall_back(self, model: str, *, external: bool) -> bool:
        """Whether a fallback may answer its request: another routed model it may use (unless
        its policy is Never), an external API only when its policy is Allowed."""
        if external:
            return self.fallback == contract.FALLBACK_ALLOWED
        return self.fallback != contract.FALLBACK_NEVER and self.may_use(model)

    def rates_for(self, model: str) -> Rates | None:
        """The stricter per-model limits that apply to `model` (the first entry matching)."""
        for entry in self.model_rates:
            if fnmatch.fnmatchcase(model, entry.model):
                return entry.rates
        return None


@dataclass(frozen=True)
class Identity:
    """Who sent a request: the tenant and which of its keys."""

    tenant: Tenant
    key_name: str


@dataclass(frozen=True)
class KeyRefusal:
    """Why a presented key is not accepted (401): `reason` is the metric's label."""

    reason: str
    message: str


@dataclass
class Directory:
    """Every tenant's keys by hash; rebuilt whole when a tenant changes (tenants are few)."""

    tenants: dict[str, Tenant] = field(default_factory=dict)
    by_hash: dict[str, tuple[Tenant, ApiKey]] = field(default_factory=dict)
    clashes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Hash → the tenants that claim it (more than one): such a key is refused."""

    @classmethod
    def of(cls, tenants: Iterable[Tenant]) -> Directory:
        directory = cls()
        owners: dict[str, list[str]] = {}
        for tenant in sorted(tenants, key=lambda t: t.name):
            directory.tenants[tenant.name] = tenant
            for key in tenant.keys:
                owners.setdefault(key.sha256, []).append(tenant.name)
                directory.by_hash[key.sha256] = (tenant, key)
        for digest, names in owners.items():
            if len(set(names)) > 1:
                directory.clashes[digest] = tuple(sorted(set(names)))
                del directory.by_hash[digest]
        return directory

    def identify(self, presented: str | None, now: float) -> Identity | KeyRefusal:
        if not presented:
            return KeyRefusal(
                "unauthenticated",
                "no API key: send 'Authorization: Bearer <key>'; a platform admin creates keys "
                "with 'llmop key new <tenant>' (an LLMTenant holds their SHA-256)",
            )
        if len(presented) > contract.MAX_API_KEY_BYTES:
            return KeyRefusal("unauthenticated", "the API key is not valid")
        digest = contract.api_key_hash(presented)
        if digest in self.clashes:
            owners = ", ".join(self.clashes[digest])
            return KeyRefusal(
                "unauthenticated",
                f"this API key's hash is listed by more than one LLMTenant ({owners}); it is "
                "refused until only one lists it",
            )
        found = self.by_hash.get(digest)
        if found is None:
            return KeyRefusal("unauthenticated", "the API key is not valid")
        tenant, key = found
        if key.disabled:
            return KeyRefusal(
                "key_disabled", f"API key {key.name!r} of tenant {tenant.name!r} is disabled"
            )
        if key.not_after is not None and now > key.not_after:
            return KeyRefusal(
                "key_expired", f"API key {key.name!r} of tenant {tenant.name!r} has expired"
            )
        return Identity(tenant, key.name)


# --- Parsing ------------------------------------------------------------------------------------


def _count(raw: Mapping[str, Any], key: str, where: str, *, least: int = 1) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise TenantError(f"{where}.{key} must be a whole number, {least} or more (got {value!r})")
    return value


def _rates(raw: Mapping[str, Any], where: str) -> Rates:
    return Rates(
        requests_per_minute=_count(raw, S.REQUESTS_PER_MINUTE, where),
        tokens_per_minute=_count(raw, S.TOKENS_PER_MINUTE, where),
        output_tokens_per_minute=_count(raw, S.OUTPUT_TOKENS_PER_MINUTE, where),
    )


def _time(text: object, where: str) -> float:
    if not isinstance(text, str):
        raise TenantError(f"{where} must be an RFC 3339 time such as 2027-03-01T00:00:00Z")
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise TenantError(
            f"{where} must be an RFC 3339 time such as 2027-03-01T00:00:00Z (got {text!r})"
        ) from None


def _keys(raw: object) -> tuple[ApiKey, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise TenantError(f"spec.{S.API_KEYS} must be a list")
    keys: list[ApiKey] = []
    names: set[str] = set()
    for i, entry in enumerate(raw):
        where = f"spec.{S.API_KEYS}[{i}]"
        if not isinstance(entry, Mapping):
            raise TenantError(f"{where} must be an object with name and sha256")
        name = entry.get(S.KEY_NAME)
        digest = entry.get(S.KEY_SHA256)
        if not isinstance(name, str) or not name:
            raise TenantError(f"{where}.name must name the key (it shows in logs and status)")
        if name in names:
            raise TenantError(f"{where}.name {name!r} is used twice in this tenant")
        names.add(name)
        if not isinstance(digest, str) or len(digest) != 64 or digest.strip("0123456789abcdef"):
            raise TenantError(
                f"{where}.sha256 must be the key's SHA-256 as 64 lowercase hex digits "
                '(printf %s "$KEY" | sha256sum), never the key itself'
            )
        not_after = entry.get(S.KEY_NOT_AFTER)
        keys.append(
            ApiKey(
                name=name,
                sha256=digest,
                not_after=None if not_after is None else _time(not_after, f"{where}.notAfter"),
                disabled=entry.get(S.KEY_DISABLED) is True,
            )
        )
    return tuple(keys)


def _budget(raw: object) -> Decimal | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise TenantError(f"spec.{S.BUDGET} must be an object such as {{monthly: '500'}}")
    monthly = raw.get(S.MONTHLY)
    if monthly is None:
        return None
    try:
        value = Decimal(str(monthly))
    except InvalidOperation:
        value = Decimal(-1)
    if not value.is_finite() or value < 0:
        raise TenantError(
            f"spec.{S.BUDGET}.{S.MONTHLY} must be a decimal amount, 0 or more (got {monthly!r})"
        )
    return value


def parse_tenant(document: Mapping[str, Any]) -> Tenant:
    """An `LLMTenant` object (as the API serves it, or as a static file holds it)."""
    metadata = document.get("metadata") or {}
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        raise TenantError("metadata.name must name the tenant")
    spec = document.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise TenantError(f"LLMTenant {name}: spec must be an object")
    try:
        return _parse_spec(name, spec)
    except TenantError as exc:
        raise TenantError(f"LLMTenant {name}: {exc}") from None


def _parse_spec(name: str, spec: Mapping[str, Any]) -> Tenant:
    models = spec.get(S.MODELS, ["*"])
    if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
        raise TenantError(f"spec.{S.MODELS} must list served names or globs ('*': every model)")
    limits = spec.get(S.LIMITS) or {}
    if not isinstance(limits, Mapping):
        raise TenantError(f"spec.{S.LIMITS} must be an object")
    where = f"spec.{S.LIMITS}"
    model_rates = []
    for i, entry in enumerate(spec.get(S.MODEL_LIMITS) or []):
        entry_where = f"spec.{S.MODEL_LIMITS}[{i}]"
        model = entry.get(S.MODEL) if isinstance(entry, Mapping) else None
        if not isinstance(model, str) or not model:
            raise TenantError(f"{entry_where}.model must name a served model or a glob")
        model_rates.append(ModelRates(model, _rates(entry, entry_where)))
    mode = limits.get(S.MODE, contract.MODE_ENFORCE)
    if mode not in (contract.MODE_ENFORCE, contract.MODE_SHADOW):
        raise TenantError(
            f"{where}.mode must be {contract.MODE_ENFORCE} or {contract.MODE_SHADOW} (got {mode!r})"
        )
    reserve = _count(limits, S.RESERVE_OUTPUT_TOKENS, where, least=0)
    burst = _count(limits, S.BURST_SECONDS, where)
    return Tenant(
        name=name,
        keys=_keys(spec.get(S.API_KEYS)),
        models=tuple(models),
        rates=_rates(limits, where),
        model_rates=tuple(model_rates),
        max_concurrent_requests=_count(limits, S.MAX_CONCURRENT_REQUESTS, where),
        max_tokens_per_request=_count(limits, S.MAX_TOKENS_PER_REQUEST, where),
        reserve_output_tokens=(
            contract.DEFAULT_RESERVE_OUTPUT_TOKENS if reserve is None else reserve
        ),
        burst_seconds=contract.DEFAULT_BURST_SECONDS if burst is None else burst,
        shadow=mode == contract.MODE_SHADOW,
        monthly_budget=_budget(spec.get(S.BUDGET)),
        priority_class=_class_name(spec.get(S.PRIORITY_CLASS_NAME)),
        weight=_weight(spec.get(S.WEIGHT)),
        fallback=_fallback_policy(spec.get(S.FALLBACK)),
    )


def _fallback_policy(value: object) -> str:
    if value is None:
        return contract.FALLBACK_IN_CLUSTER_ONLY
    if value not in contract.FALLBACK_POLICIES:
        raise TenantError(
            f"spec.{S.FALLBACK} must be one of {', '.join(contract.FALLBACK_POLICIES)} "
            f"(got {value!r})"
        )
    return str(value)


def _class_name(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise TenantError(f"spec.{S.PRIORITY_CLASS_NAME} must name an LLMPriorityClass")
    return value


def _weight(value: object) -> int:
    if value is None:
        return 1
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not 1 <= value <= contract.MAX_WEIGHT
    ):
        raise TenantError(
            f"spec.{S.WEIGHT} must be a whole number from 1 to {contract.MAX_WEIGHT} "
            f"(got {value!r})"
        )
    return value
