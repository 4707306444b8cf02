"""Pure: the adapter pre-flight verdict — may the engine pods be told about this hf:// adapter?

Before an hf:// adapter reaches the `<name>-adapters` ConfigMap, the operator asks the Hub
(through `llmop.hub.adapter_probe`, the one module that talks to it) which commit the revision
names, which files it has, whether our token may read them, and what its `adapter_config.json`
says. This module turns that answer into a verdict: accepted (the resolved commit, whether the
revision floats, the rank and target modules), or a `Refusal` naming `spec.adapters[<name>]` and
the fix. vLLM 0.32 would refuse the same files at load time (`PEFTHelper.validate_legal`,
`LoRAModel.from_local_checkpoint`); refusing here says why in status before any pod tries, and
never touches the base model: a refused adapter is only left out of the ConfigMap.

Refusal reasons:

- `AdapterNotFound`: no such repository, no such revision in it, or no `adapter_config.json` (or
  no `adapter_model.safetensors`/`.bin`/`.pt`) at that revision;
- `AdapterAccessDenied`: a gated or private adapter without `spec.model.tokenSecretRef` (adapters
  use the model's token), a token without access, or a token the Hub rejects;
- `AdapterNotLoRA`: `peft_type` is not `LORA`, `adapter_config.json` is not a JSON object, or it
  has no positive integer rank `r`;
- `AdapterDoRA`: `use_dora` is true;
- `AdapterBias`: `bias` is not `"none"`, or `lora_bias` is true;
- `AdapterModulesToSave`: `modules_to_save` names modules other than `classifier`/`score`;
- `AdapterRankTooHigh`: the largest rank (`r`, or a `rank_pattern` value) is above
  `spec.engine.lora.maxLoraRank`; the message names the smallest allowed value that holds it;
- `AdapterUnknownTargetModules`: a `target_modules` entry is not a module of the base model —
  checked only when the base's `model_type` is one this module knows (`BASE_MODULES`); an unknown
  type, a pvc:// base, or a regex/`all-linear` `target_modules` skips the check.

A Hub that cannot be reached is no verdict (`verdict` returns None): the adapter is neither
accepted nor refused, and the parent path asks again on its next pass.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmop.api.v1alpha1 import AdapterSpec, AdapterStatus, LLMDeploymentSpec
from llmop.preflight import HubFailure, is_commit
from llmop.render.adapters import Refusal, hub_repo, lora_slots
from llmop.render.model_source import pvc_claim

REASON_NOT_FOUND = "AdapterNotFound"
REASON_ACCESS_DENIED = "AdapterAccessDenied"
REASON_NOT_LORA = "AdapterNotLoRA"
REASON_DORA = "AdapterDoRA"
REASON_BIAS = "AdapterBias"
REASON_MODULES_TO_SAVE = "AdapterModulesToSave"
REASON_RANK_TOO_HIGH = "AdapterRankTooHigh"
REASON_UNKNOWN_TARGET_MODULES = "AdapterUnknownTargetModules"

ADAPTER_CONFIG = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin", "adapter_model.pt")
"""The files vLLM 0.32 loads an adapter's weights from (`lora/lora_model.py`), in its order."""
ALLOWED_RANKS = (8, 16, 32, 64, 128, 256)
"""`spec.engine.lora.maxLoraRank`'s values (the API's `LoraRank`)."""
ALLOWED_MODULES_TO_SAVE = frozenset({"classifier", "score"})
"""The only `modules_to_save` vLLM 0.32 accepts (classification heads)."""

_DECODER_MODULES = frozenset(
    {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
        "embed_tokens",
        "lm_head",
    }
)
BASE_MODULES: Mapping[str, frozenset[str]] = dict.fromkeys(
    ("llama", "mistral", "qwen2", "qwen3", "gemma"), _DECODER_MODULES
)
"""The module names a LoRA adapter may target, by the base's `config.json` `model_type`. Only
bases listed here are checked: vLLM matches the last dotted part of each adapter tensor's name
against the model's LoRA-capable modules, and a wrong guess here would refuse a good adapter."""

_MAX_CONFIG_CHARS = 200


@dataclass(frozen=True)
class AdapterFacts:
    """The Hub's answer for one adapter when it answered: the commit the revision names, the
    files at that commit, gated or not, and the text of `adapter_config.json` (None when the
    commit has none)."""

    sha: str
    files: tuple[str, ...]
    gated: bool = False
    adapter_config: str | None = None


AdapterAnswer = AdapterFacts | HubFailure


@dataclass(frozen=True)
class Accepted:
    """An adapter the pods may load: at `sha` (what the ConfigMap pins), of rank `rank`."""

    sha: str
    floating: bool
    """The spec's revision is not a full commit sha (a branch, a tag, or none: main)."""
    rank: int
    target_modules: tuple[str, ...]
    message: str = ""
    """The FloatingRevision warning for a floating revision, else empty."""


AdapterVerdict = Accepted | Refusal


def allowed_rank(rank: int) -> int | None:
    """The smallest `maxLoraRank` that holds `rank` (None: above every allowed value)."""
    return next((r for r in ALLOWED_RANKS if r >= rank), None)


def verdict(
    adapter: AdapterSpec,
    answer: AdapterAnswer,
    *,
    max_lora_rank: int,
    base_model_type: str | None,
    token_secret: str | None,
) -> AdapterVerdict | None:
    """The pre-flight verdict of one hf:// `adapter` from the Hub's `answer`. `max_lora_rank`
    is the slots' cap (`render.adapters.lora_slots(spec).max_lora_rank`); `base_model_type` the
    base model's `model_type` (None: unknown, no target-module check); `token_secret` names the
    token Secret (`name/key`) when the spec has one. None when the Hub could not be reached."""
    field = f"spec.adapters[{adapter.name}]"
    repo = hub_repo(adapter) or adapter.source
    if isinstance(answer, HubFailure):
        return _failure(field, repo, adapter.revision, token_secret, answer)
    at = f"{repo}@{answer.sha[:12]}"
    if answer.adapter_config is None:
        return Refusal(
            REASON_NOT_FOUND,
            f"{field}: {at} has no {ADAPTER_CONFIG}, so it is not a PEFT adapter: point "
            f"{field}.source at the adapter's repo, or {field}.revision at a commit that has it",
        )
    if not any(name in answer.files for name in WEIGHT_FILES):
        return Refusal(
            REASON_NOT_FOUND,
            f"{field}: {at} has {ADAPTER_CONFIG} but no adapter weights "
            f"({', '.join(WEIGHT_FILES)}): point {field}.revision at a commit with the weights",
        )
    config = _parse(answer.adapter_config)
    if config is None:
        return Refusal(
            REASON_NOT_LORA,
            f"{field}: {at}'s {ADAPTER_CONFIG} is not a JSON object "
            f"({answer.adapter_config[:_MAX_CONFIG_CHARS]!r}): use a PEFT LoRA adapter",
        )
    refusal = _features(field, at, config)
    if refusal is not None:
        return refusal
    rank = _rank(config)
    if rank is None:
        return Refusal(
            REASON_NOT_LORA,
            f"{field}: {at}'s {ADAPTER_CONFIG} has no positive integer rank r (r: "
            f"{config.get('r')!r}, rank_pattern: {config.get('rank_pattern')!r}): use a PEFT "
            "LoRA adapter",
        )
    if rank > max_lora_rank:
        allowed = allowed_rank(rank)
        fix = (
            f"raise spec.engine.lora.maxLoraRank to {allowed} (restarts the engine pods) or use "
            "a lower-rank adapter"
            if allowed is not None
            else f"use an adapter of rank {ALLOWED_RANKS[-1]} or less (no allowed "
            "spec.engine.lora.maxLoraRank holds it)"
        )
        return Refusal(
            REASON_RANK_TOO_HIGH,
            f"{field}: rank {rank} is above spec.engine.lora.maxLoraRank ({max_lora_rank}): {fix}",
        )
    modules = _target_modules(config)
    known = BASE_MODULES.get(base_model_type or "")
    if known is not None and modules is not None:
        unknown = [m for m in modules if m.rsplit(".", 1)[-1] not in known]
        if unknown:
            return Refusal(
                REASON_UNKNOWN_TARGET_MODULES,
                f"{field}: target_modules {unknown} are not modules of the base model (a "
                f"{base_model_type} model has {', '.join(sorted(known))}): use an adapter "
                "trained for this base model",
            )
    floating = not is_commit(adapter.revision)
    return Accepted(
        sha=answer.sha,
        floating=floating,
        rank=rank,
        target_modules=tuple(modules or ()),
        message=(
            f"{field}.revision {adapter.revision or '(unset: main)'} is a branch or tag; it "
            f"resolved to {answer.sha} now but may move: pin {field}.revision to {answer.sha} "
            "for reproducible loads"
            if floating
            else ""
        ),
    )


def _parse(text: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _features(field: str, at: str, config: Mapping[str, Any]) -> Refusal | None:
    """What vLLM 0.32 refuses whatever the slots (`PEFTHelper`): not LoRA, DoRA, biases,
    saved modules other than a classification head."""
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        return Refusal(
            REASON_NOT_LORA,
            f"{field}: {at} is not a LoRA adapter (peft_type {peft_type!r}): vLLM serves LoRA "
            "adapters only: use a LoRA adapter",
        )
    if config.get("use_dora") is True:
        return Refusal(
            REASON_DORA,
            f"{field}: {at} is a DoRA adapter (use_dora: true), which vLLM does not serve: use "
            "an adapter trained with use_dora false",
        )
    bias = config.get("bias", "none")
    if bias != "none" or config.get("lora_bias") is True:
        what = f"bias: {bias!r}" if bias != "none" else "lora_bias: true"
        return Refusal(
            REASON_BIAS,
            f"{field}: {at} trains biases ({what}), which vLLM does not serve: use an adapter "
            'trained with bias "none" and lora_bias false',
        )
    saved = config.get("modules_to_save") or []
    others = [
        m
        for m in (saved if isinstance(saved, list) else [saved])
        if m not in ALLOWED_MODULES_TO_SAVE
    ]
    if others:
        return Refusal(
            REASON_MODULES_TO_SAVE,
            f"{field}: {at} saves whole modules {others} (modules_to_save), which vLLM "
            "refuses except classifier and score: use an adapter trained without "
            "modules_to_save",
        )
    return None


def _rank(config: Mapping[str, Any]) -> int | None:
    """The largest rank any module gets (`r`, or a `rank_pattern` override), as vLLM checks it
    against `--max-lora-rank`; None unless every one is a positive integer."""
    pattern = config.get("rank_pattern") or {}
    ranks = [config.get("r"), *(pattern.values() if isinstance(pattern, dict) else [pattern])]
    if not all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in ranks):
        return None
    return max(r for r in ranks if isinstance(r, int))


def _target_modules(config: Mapping[str, Any]) -> list[str] | None:
    """The adapter's `target_modules` as a list of names; None when they cannot be checked by
    name (PEFT reads a single string as a regex, or as `all-linear`)."""
    modules = config.get("target_modules")
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        return None
    return modules


def _failure(
    field: str, repo: str, revision: str | None, token_secret: str | None, answer: HubFailure
) -> Refusal | None:
    detail = f" (hub: {answer.detail})" if answer.detail else ""
    if answer.kind == "unreachable":
        return None
    if answer.kind == "no_token" and token_secret is not None:
        # The spec names a token but its Secret or key is missing: the probe went anonymous.
        return Refusal(
            REASON_ACCESS_DENIED,
            f"{field}: {repo} is gated or private and the token Secret {token_secret} named by "
            "spec.model.tokenSecretRef does not exist or lacks that key: create it with a "
            "token that has access to the adapter" + detail,
        )
    if answer.kind == "no_token":
        return Refusal(
            REASON_ACCESS_DENIED,
            f"{field}: {repo} is gated or private and spec.model.tokenSecretRef is not set "
            "(adapters use the model's token): accept the adapter's terms on the Hub with an "
            "account, put that account's token in a Secret and point spec.model.tokenSecretRef "
            "at it" + detail,
        )
    if answer.kind in ("access_denied", "invalid_token"):
        what = (
            "is not accepted by the Hub (revoked or mistyped)"
            if answer.kind == "invalid_token"
            else f"has no access to {repo}"
        )
        return Refusal(
            REASON_ACCESS_DENIED,
            f"{field}: the token in Secret {token_secret or '(unknown)'} {what}: request access "
            f"to {repo} on the Hub with the token's account, or put a token that has access in "
            "that Secret" + detail,
        )
    if answer.kind == "revision_not_found":
        return Refusal(
            REASON_NOT_FOUND,
            f"{field}.revision: {repo} has no revision {revision!r}: set it to an existing "
            "commit sha, branch or tag" + detail,
        )
    return Refusal(
        REASON_NOT_FOUND,
        f"{field}.source: no adapter repo {repo!r} on the Hub: check the org/name "
        "(case-sensitive); a private repo also needs spec.model.tokenSecretRef" + detail,
    )


AskedFor = tuple[str, str | None, str | None]
"""What one Hub answer was asked for: (source or base model name, revision, token Secret
`name/key`). An answer counts only while the spec still asks the same."""


def asked_for(adapter: AdapterSpec, token_secret: str | None) -> AskedFor:
    """The question the pre-flight of `adapter` asks the Hub."""
    return (adapter.source, adapter.revision, token_secret)


def base_asked_for(spec: LLMDeploymentSpec, token_secret: str | None) -> AskedFor | None:
    """The question for the base model's `model_type` (None: a pvc:// base, nothing to ask)."""
    if pvc_claim(spec.model) is not None:
        return None
    return (spec.model.name, spec.model.revision, token_secret)


def judge(
    spec: LLMDeploymentSpec,
    answers: Mapping[str, tuple[AskedFor, AdapterAnswer]],
    *,
    base_model_type: str | None,
    token_secret: str | None,
) -> dict[str, AdapterVerdict | None]:
    """The verdict of every hf:// adapter of `spec` from the remembered `answers` (by name);
    None where no answer was had for what the spec asks now. Reached again from the answers at
    every use, so a new `maxLoraRank` re-judges an adapter without asking the Hub."""
    slots = lora_slots(spec)
    cap = slots.max_lora_rank if slots is not None else ALLOWED_RANKS[-1]
    out: dict[str, AdapterVerdict | None] = {}
    for adapter in spec.adapters:
        if hub_repo(adapter) is None:
            continue
        stored = answers.get(adapter.name)
        if stored is None or stored[0] != asked_for(adapter, token_secret):
            out[adapter.name] = None
            continue
        out[adapter.name] = verdict(
            adapter,
            stored[1],
            max_lora_rank=cap,
            base_model_type=base_model_type,
            token_secret=token_secret,
        )
    return out


def refused(verdicts: Mapping[str, AdapterVerdict | None]) -> dict[str, Refusal]:
    """The refusals among `verdicts`, by adapter name."""
    return {name: v for name, v in verdicts.items() if isinstance(v, Refusal)}


def pinned(verdicts: Mapping[str, AdapterVerdict | None]) -> dict[str, str]:
    """The commit each accepted adapter resolved to, by adapter name (what the pods load)."""
    return {name: v.sha for name, v in verdicts.items() if isinstance(v, Accepted)}


def with_verdicts(
    statuses: Sequence[AdapterStatus] | None, verdicts: Mapping[str, AdapterVerdict | None]
) -> list[AdapterStatus] | None:
    """`statuses` with what the pre-flight knows before any replica reports: an accepted
    adapter's resolved commit as its revision, and its rank until a replica reports one."""
    if statuses is None:
        return None
    out = []
    for status in statuses:
        accepted = verdicts.get(status.name)
        out.append(
            status.model_copy(
                update={"revision": accepted.sha, "rank": status.rank or accepted.rank}
            )
            if isinstance(accepted, Accepted)
            else status
        )
    return out
