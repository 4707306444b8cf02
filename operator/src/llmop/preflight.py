"""Pure: the model pre-flight verdict — may engine pods be created for this model?

Before any GPU pod exists, the operator asks the Hub (through `llmop.hub`, the one module that
talks to it) three things: which commit the revision names, whether our token may read the files,
and how many bytes the files take. This module turns the Hub's answer into a verdict: a resolved
revision to record in `status.model.resolvedRevision`, whether that revision floats (a branch or
tag, worth a Warning Event), and — when the answer is no — a Stalled reason with a message that
names the fix:

- `ModelAccessDenied`: gated/private model without a token, a token without access, or a token the
  Hub rejects;
- `ModelNotFound`: no such repository, or no such revision in it;
- `CacheTooSmall`: the files do not fit the cache volume (checked with headroom, before anything is
  created, so nobody finds out from a full disk an hour into a download).

A Hub that cannot be reached is not a verdict on the spec: `retry` says to try again later.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from llmop.quantity import GIB

REASON_MODEL_ACCESS_DENIED = "ModelAccessDenied"
REASON_MODEL_NOT_FOUND = "ModelNotFound"
REASON_CACHE_TOO_SMALL = "CacheTooSmall"
REASON_FLOATING_REVISION = "FloatingRevision"

CACHE_HEADROOM = 1.05
"""The cache must hold the files plus 5 %: filesystem metadata and reserved blocks (ext4 keeps
5 % for root by default), so a cache sized to the byte does not fill up at 99 %."""

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def is_commit(revision: str | None) -> bool:
    """True for a full commit sha (immutable); a branch, tag or short sha floats."""
    return revision is not None and _COMMIT.match(revision) is not None


@dataclass(frozen=True)
class HubFacts:
    """The Hub's answer when it answered: the commit, the files' total size, gated or not."""

    sha: str
    total_bytes: int
    gated: bool = False


FailureKind = Literal[
    "no_token",  # gated or private, and we sent no token
    "access_denied",  # our token may not read it
    "invalid_token",  # the Hub rejects the token itself
    "repo_not_found",
    "revision_not_found",
    "unreachable",  # network, timeouts, 5xx: not a verdict on the spec
]


@dataclass(frozen=True)
class HubFailure:
    kind: FailureKind
    detail: str = ""


HubAnswer = HubFacts | HubFailure


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str | None = None
    message: str = ""
    resolved_revision: str | None = None
    total_bytes: int | None = None
    floating: bool = False
    retry: bool = False


def cache_needed_bytes(total_bytes: int) -> int:
    return math.ceil(total_bytes * CACHE_HEADROOM)


def suggested_size(total_bytes: int) -> str:
    """The smallest whole-GiB quantity that passes the check, e.g. `17Gi`."""
    return f"{max(1, math.ceil(cache_needed_bytes(total_bytes) / GIB))}Gi"


def _gib(value: float) -> str:
    if value < GIB:
        return f"{value / 2**20:.1f} MiB"
    return f"{value / GIB:.2f} GiB"


def verdict(
    *,
    model: str,
    revision: str | None,
    token_secret: str | None,
    answer: HubAnswer,
    cache_bytes: float | None,
    cache_field: str = "spec.model.cache.size",
) -> Verdict:
    """The pre-flight verdict. `token_secret` names the token Secret (`name/key`) when the spec
    has one; `cache_bytes` is the cache volume's capacity (None: no cache volume to check)."""
    at = f"{model}@{revision or 'main'}"
    if isinstance(answer, HubFailure):
        return _failure(at, model, revision, token_secret, answer)
    floating = not is_commit(revision)
    if cache_bytes is not None and cache_needed_bytes(answer.total_bytes) > cache_bytes:
        return Verdict(
            ok=False,
            reason=REASON_CACHE_TOO_SMALL,
            message=(
                f"{model} at {answer.sha[:12]} is {_gib(answer.total_bytes)}; with 5% headroom "
                f"the cache needs {_gib(cache_needed_bytes(answer.total_bytes))} but "
                f"{cache_field} gives {_gib(cache_bytes)}: set {cache_field} to at least "
                f"{suggested_size(answer.total_bytes)} (a new claim: the size of a bound one "
                "can only grow where its StorageClass allows expansion)"
            ),
            resolved_revision=answer.sha,
            total_bytes=answer.total_bytes,
            floating=floating,
        )
    return Verdict(
        ok=True,
        resolved_revision=answer.sha,
        total_bytes=answer.total_bytes,
        floating=floating,
        message=(
            f"spec.model.revision {revision or '(unset: main)'} is a branch or tag; it resolved "
            f"to {answer.sha} now but may move: pin spec.model.revision to {answer.sha} for "
            "reproducible rollouts"
            if floating
            else ""
        ),
    )


def _failure(
    at: str, model: str, revision: str | None, token_secret: str | None, answer: HubFailure
) -> Verdict:
    detail = f" (hub: {answer.detail})" if answer.detail else ""
    if answer.kind == "unreachable":
        return Verdict(ok=False, retry=True, message=f"cannot reach the model hub for {at}{detail}")
    if answer.kind == "no_token":
        message = (
            f"{model} is gated or private and spec.model.tokenSecretRef is not set: accept the "
            "model's terms on the Hub with an account, create a Secret holding that account's "
            "token and point spec.model.tokenSecretRef at it"
        )
        return Verdict(ok=False, reason=REASON_MODEL_ACCESS_DENIED, message=message + detail)
    if answer.kind in ("access_denied", "invalid_token"):
        what = (
            "is not accepted by the Hub (revoked or mistyped)"
            if answer.kind == "invalid_token"
            else f"has no access to {model}"
        )
        message = (
            f"the token in Secret {token_secret or '(unknown)'} {what}: request access to "
            f"{model} on the Hub with the token's account, or put a token that has access in "
            "that Secret"
        )
        return Verdict(ok=False, reason=REASON_MODEL_ACCESS_DENIED, message=message + detail)
    if answer.kind == "revision_not_found":
        message = (
            f"{model} has no revision {revision!r}: set spec.model.revision to an existing "
            "commit sha, branch or tag"
        )
        return Verdict(ok=False, reason=REASON_MODEL_NOT_FOUND, message=message + detail)
    message = (
        f"no model {model!r} on the Hub: check spec.model.name (org/name, case-sensitive); a "
        "private model also needs spec.model.tokenSecretRef"
    )
    return Verdict(ok=False, reason=REASON_MODEL_NOT_FOUND, message=message + detail)
