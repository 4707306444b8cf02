"""Pure: `LLMExternalModel` objects → the APIs outside the cluster a routed model may fall back
to, with their keys, their concurrency and what the router can say about each
(docs/gateway.md, "Fallback").

An external model lives in the router's namespace beside the Secret that holds its key; the
router reads the Secret (`kube.read_secret`) and hands the key here, or why it has none. A
fallback to an external model is taken only while it is usable (its key read, when it names
one) and below its `maxConcurrentRequests` on this router pod; otherwise the model's own answer
stands. Its status is one `Ready` condition saying which.

The same parser reads the watched objects and a static table's `externalModels`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from llmop_router import contract
from llmop_router.contract import ExternalModelSpec as S

READY: Final = "Ready"
SECRET_NOT_FOUND: Final = "SecretNotFound"
SECRET_FORBIDDEN: Final = "SecretForbidden"
KEY_MISSING: Final = "KeyMissing"
KEY_READ: Final = "KeyRead"
NO_KEY_NEEDED: Final = "NoKeyNeeded"


class ExternalModelError(ValueError):
    """An `LLMExternalModel` the router cannot use: the message names the field and the fix."""


@dataclass(frozen=True)
class SecretRef:
    name: str
    key: str = "apiKey"


@dataclass(frozen=True)
class ExternalModel:
    namespace: str
    name: str
    base_url: str
    """Without a trailing slash: the route after `/v1` is appended."""
    model: str
    """The name sent upstream."""
    secret: SecretRef | None = None
    pricing: Mapping[str, Any] | None = None
    """As `spec.router.pricing` of an LLMDeployment (the gateway reads it)."""
    max_concurrent: int = contract.DEFAULT_EXTERNAL_CONCURRENCY
    timeout_seconds: float = float(contract.DEFAULT_EXTERNAL_TIMEOUT_SECONDS)

    @property
    def key(self) -> tuple[str, str]:
        """Its key for prices and metering: never an LLMDeployment's (a name has no `/`)."""
        return self.namespace, f"{contract.EXTERNAL_MODEL_KIND}/{self.name}"

    def url(self, route: str) -> str:
        """The upstream URL of an inference route (`/v1/chat/completions`)."""
        return self.base_url + route.removeprefix("/v1")


@dataclass
class Externals:
    """The external models of the router's namespace, their keys and their requests in flight
    on this pod."""

    models: dict[str, ExternalModel] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    """Name → its API key, once read."""
    problems: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Name → why it has no key (reason, message)."""
    in_flight: dict[str, int] = field(default_factory=dict)

    def put(self, model: ExternalModel) -> None:
        old = self.models.get(model.name)
        self.models[model.name] = model
        if old is not None and old.secret != model.secret:
            # Another Secret (or none): what was read of the old one no longer applies.
            self.keys.pop(model.name, None)
            self.problems.pop(model.name, None)

    def remove(self, name: str) -> None:
        self.models.pop(name, None)
        self.keys.pop(name, None)
        self.problems.pop(name, None)

    def key_read(self, name: str, key: str | None, problem: tuple[str, str] | None) -> None:
        """The outcome of reading `name`'s Secret: the key, or why there is none."""
        if key is not None:
            self.keys[name] = key
            self.problems.pop(name, None)
        else:
            self.keys.pop(name, None)
            if problem is not None:
                self.problems[name] = problem

    def usable(self, name: str) -> tuple[ExternalModel, str | None] | None:
        """The model and its key (None: it needs none) when a request may go to it now: it
        exists, its key is read, and it is below its concurrency; else None."""
        model = self.models.get(name)
        if model is None:
            return None
        key = self.keys.get(name)
        if model.secret is not None and key is None:
            return None
        if self.in_flight.get(name, 0) >= model.max_concurrent:
            return None
        return model, key

    def start(self, name: str) -> None:
        self.in_flight[name] = self.in_flight.get(name, 0) + 1

    def end(self, name: str) -> None:
        left = self.in_flight.get(name, 0) - 1
        if left > 0:
            self.in_flight[name] = left
        else:
            self.in_flight.pop(name, None)

    def readiness(self, name: str) -> tuple[bool, str, str]:
        """Its `Ready` condition: status, reason, message."""
        model = self.models[name]
        if model.secret is None:
            return True, NO_KEY_NEEDED, "no apiKeySecretRef: requests are sent without a key"
        if name in self.keys:
            return (
                True,
                KEY_READ,
                f"the key {model.secret.key!r} of Secret {model.secret.name} is read",
            )
        reason, message = self.problems.get(
            name, ("Pending", f"reading Secret {model.secret.name}")
        )
        return False, reason, message


def secret_problem(ref: SecretRef, namespace: str, status: int) -> tuple[str, str]:
    """Why a Secret could not be read (the API's HTTP status), with the fix."""
    if status == 404:
        return SECRET_NOT_FOUND, (
            f"Secret {namespace}/{ref.name} does not exist: create it with the API key under "
            f"{ref.key!r} (kubectl -n {namespace} create secret generic {ref.name} "
            f"--from-literal={ref.key}=<key>)"
        )
    if status == 403:
        return SECRET_FORBIDDEN, (
            f"the router may not read Secret {namespace}/{ref.name} (HTTP 403): its Role allows "
            "get on Secrets in the router's own namespace only; put the LLMExternalModel and "
            "its Secret there"
        )
    return "SecretUnreadable", f"reading Secret {namespace}/{ref.name} failed (HTTP {status})"


def key_missing(ref: SecretRef, namespace: str) -> tuple[str, str]:
    return KEY_MISSING, (
        f"Secret {namespace}/{ref.name} has no key {ref.key!r}: add it, or name the key that "
        "holds the API key in spec.apiKeySecretRef.key"
    )


def _whole(raw: Mapping[str, Any], key: str, default: int, high: int) -> int:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
        raise ExternalModelError(f"spec.{key} must be a whole number from 1 to {high}")
    return value


def parse_external_model(document: Mapping[str, Any], namespace: str = "") -> ExternalModel:
    """An `LLMExternalModel` object (as the API serves it, or a static table's entry with
    `metadata.name`)."""
    metadata = document.get("metadata") or {}
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ExternalModelError("LLMExternalModel: metadata.name must name it")
    spec = document.get("spec") or {}
    try:
        if not isinstance(spec, Mapping):
            raise ExternalModelError("spec must be an object")
        return _parse_spec(str(metadata.get("namespace") or namespace), name, spec)
    except ExternalModelError as exc:
        raise ExternalModelError(f"LLMExternalModel {name}: {exc}") from None


def _parse_spec(namespace: str, name: str, spec: Mapping[str, Any]) -> ExternalModel:
    base_url = spec.get(S.BASE_URL)
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ExternalModelError(
            f"spec.{S.BASE_URL} must be an http(s) URL up to the API's version "
            "(e.g. https://api.example.com/v1)"
        )
    model = spec.get(S.MODEL)
    if not isinstance(model, str) or not model:
        raise ExternalModelError(f"spec.{S.MODEL} must name the model sent upstream")
    secret = None
    ref = spec.get(S.API_KEY_SECRET_REF)
    if ref is not None:
        secret_name = ref.get(S.SECRET_NAME) if isinstance(ref, Mapping) else None
        key = ref.get(S.SECRET_KEY, "apiKey") if isinstance(ref, Mapping) else None
        if not isinstance(secret_name, str) or not secret_name or not isinstance(key, str):
            raise ExternalModelError(
                f"spec.{S.API_KEY_SECRET_REF} must name a Secret (name) and its key (key)"
            )
        secret = SecretRef(secret_name, key or "apiKey")
    pricing = spec.get(contract.Pricing.PRICING)
    timeout = _whole(
        spec,
        S.TIMEOUT_SECONDS,
        contract.DEFAULT_EXTERNAL_TIMEOUT_SECONDS,
        contract.MAX_EXTERNAL_TIMEOUT_SECONDS,
    )
    return ExternalModel(
        namespace=namespace,
        name=name,
        base_url=base_url.rstrip("/"),
        model=model,
        secret=secret,
        pricing=pricing if isinstance(pricing, Mapping) else None,
        max_concurrent=_whole(
            spec,
            S.MAX_CONCURRENT_REQUESTS,
            contract.DEFAULT_EXTERNAL_CONCURRENCY,
            contract.MAX_EXTERNAL_CONCURRENCY,
        ),
        timeout_seconds=float(timeout),
    )
