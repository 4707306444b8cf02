"""Pure: what the engine pods are told about LoRA adapters — the `--enable-lora` start flags, the
ConfigMap `<name>-adapters` holding the desired set, its volume, and where each adapter's files
are inside a pod.

The split is the point: the pod template carries only what vLLM sizes at start (the slots and
the largest rank), so adding or removing an adapter edits the ConfigMap and restarts nothing;
the agent in each pod follows the mounted file and loads or unloads through vLLM's runtime API.
Turning LoRA on (the first adapter, or `spec.engine.lora`) is a template change and so a
normal drained rollout.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from llmop import kinds, names
from llmop.api.v1alpha1 import AdapterSpec, LLMDeployment, LLMDeploymentSpec, LoraSpec
from llmop.render import model_cache
from llmop.render.metadata import child_metadata
from llmop.render.model_source import PVC_SCHEME, pvc_claim
from llmop.settings import RenderSettings
from llmop_engine import contract
from llmop_engine.contract import AdapterKey, EngineFlag

HF_SCHEME = "hf://"
ADAPTERS_VOLUME = "adapters"
REASON_CLAIM_NOT_MOUNTED = "AdapterClaimNotMounted"


def config_map_name(name: str) -> str:
    """`<name>-adapters`: the desired adapter set of one LLMDeployment."""
    return f"{name}-adapters"


def lora_enabled(spec: LLMDeploymentSpec) -> bool:
    """LoRA is on when the slots are set or any adapter is declared (with default slots)."""
    return spec.lora_slots is not None


def lora_slots(spec: LLMDeploymentSpec) -> LoraSpec | None:
    """The LoRA slots the engine starts with (the defaults when only adapters imply them)."""
    return spec.lora_slots


def lora_flags(spec: LLMDeploymentSpec) -> list[str]:
    """`--enable-lora` and the three slot flags, or nothing when LoRA is off. Never derived
    from the adapter list: then an adapter change would be a rollout."""
    slots = lora_slots(spec)
    if slots is None:
        return []
    return [
        EngineFlag.ENABLE_LORA,
        EngineFlag.MAX_LORAS,
        str(slots.max_loras),
        EngineFlag.MAX_CPU_LORAS,
        str(slots.max_cpu_loras),
        EngineFlag.MAX_LORA_RANK,
        str(slots.max_lora_rank),
    ]


def lora_env(spec: LLMDeploymentSpec) -> dict[str, str]:
    """The agent's adapter settings and vLLM's runtime-update switch (LoRA on only)."""
    if not lora_enabled(spec):
        return {}
    return {
        contract.LORA_RUNTIME_ENV: "True",
        contract.row("adapters_dir").env or "": contract.ADAPTERS_DIR,
        contract.row("adapter_store").env or "": adapter_store(),
    }


def hub_env(spec: LLMDeploymentSpec, settings: RenderSettings) -> list[dict[str, str]]:
    """The operator's Hub endpoint for the agent's adapter fetches (LoRA on only, whether or
    not a Hub adapter is declared yet: adding one is then no template change)."""
    if not lora_enabled(spec) or not settings.hub_endpoint:
        return []
    return [{"name": "HF_ENDPOINT", "value": settings.hub_endpoint}]


def adapter_store() -> str:
    """Where the agent fetches Hub adapters: beside the model in the model cache volume — the
    shared claim when the model has a cache (one copy for every pod), else the pod's own
    emptyDir."""
    return f"{names.MODEL_CACHE_PATH}/{contract.ADAPTER_STORE_IN_CACHE}"


def volume(llmd: LLMDeployment) -> dict[str, Any] | None:
    """The ConfigMap as a directory volume. Never a subPath mount: the kubelet updates only
    whole-directory ConfigMap volumes in place. Not optional: a pod never starts without
    knowing its adapters (the operator applies the ConfigMap before the workload)."""
    if not lora_enabled(llmd.spec):
        return None
    return {
        "name": ADAPTERS_VOLUME,
        "configMap": {"name": config_map_name(llmd.metadata.name)},
    }


def volume_mount(llmd: LLMDeployment) -> dict[str, Any] | None:
    if not lora_enabled(llmd.spec):
        return None
    return {"name": ADAPTERS_VOLUME, "mountPath": contract.ADAPTERS_DIR, "readOnly": True}


@dataclass(frozen=True)
class Refusal:
    """An adapter the operator will not hand to the pods, and why (named in its status)."""

    reason: str
    message: str


def hub_repo(adapter: AdapterSpec) -> str | None:
    """The Hub repo id of an hf:// adapter."""
    if adapter.source.startswith(HF_SCHEME):
        return adapter.source[len(HF_SCHEME) :]
    return None


def pod_path(llmd: LLMDeployment, adapter: AdapterSpec) -> str | Refusal | None:
    """Where a pvc:// adapter's folder is inside an engine pod (None for hf:// adapters, which
    the agent fetches), or why it cannot be reached: the claim must be one the pods mount —
    the model's own (pvc:// model) or the model cache's."""
    if not adapter.source.startswith(PVC_SCHEME):
        return None
    claim, _, path = adapter.source[len(PVC_SCHEME) :].partition("/")
    path = path.strip("/")
    if claim == pvc_claim(llmd.spec.model):
        return f"{names.PVC_MOUNT_ROOT}/{claim}/{path}"
    if claim == model_cache.cache_claim(llmd):
        return f"{names.MODEL_CACHE_PATH}/{path}"
    mounted = [c for c in (pvc_claim(llmd.spec.model), model_cache.cache_claim(llmd)) if c]
    return Refusal(
        REASON_CLAIM_NOT_MOUNTED,
        f"spec.adapters[{adapter.name}].source: the engine pods do not mount claim {claim!r}"
        + (f" (they mount {', '.join(repr(c) for c in mounted)})" if mounted else "")
        + ": put the adapter on the model's claim or the model cache's claim, or use hf://",
    )


def refusals(llmd: LLMDeployment) -> dict[str, Refusal]:
    """The declared adapters the pods are not told about, by name."""
    out: dict[str, Refusal] = {}
    for adapter in llmd.spec.adapters:
        where = pod_path(llmd, adapter)
        if isinstance(where, Refusal):
            out[adapter.name] = where
    return out


def desired_entries(
    llmd: LLMDeployment,
    *,
    refused: Collection[str] = (),
    pinned: Mapping[str, str] | None = None,
) -> list[dict[str, str | None]]:
    """The `adapters.json` entries (`contract.AdapterKey`), in spec order, refused ones left out:
    those refused here and the names in `refused` (the Hub pre-flight's refusals). `pinned`
    maps an adapter to the commit the pre-flight resolved its revision to: the pods load that
    commit, not whatever a branch names when each pod fetches."""
    entries: list[dict[str, str | None]] = []
    for adapter in llmd.spec.adapters:
        where = pod_path(llmd, adapter)
        if isinstance(where, Refusal) or adapter.name in refused:
            continue
        entries.append(
            {
                AdapterKey.NAME: adapter.name,
                AdapterKey.REPO: hub_repo(adapter),
                AdapterKey.REVISION: (pinned or {}).get(adapter.name, adapter.revision),
                AdapterKey.PATH: where,
            }
        )
    return entries


def render_config_map(
    llmd: LLMDeployment,
    *,
    refused: Collection[str] = (),
    pinned: Mapping[str, str] | None = None,
) -> dict[str, Any] | None:
    """The ConfigMap the pods mount (None while LoRA is off). It exists whenever LoRA is on,
    also with no adapter, so the mount never blocks a pod's start. `refused` and `pinned`: the
    Hub pre-flight's verdicts (`desired_entries`), applied by the reconcile to the rendered
    children, since rendering does no I/O."""
    if not lora_enabled(llmd.spec):
        return None
    payload = {"adapters": desired_entries(llmd, refused=refused, pinned=pinned)}
    return {
        "apiVersion": kinds.CONFIG_MAP.api_version,
        "kind": kinds.CONFIG_MAP.kind,
        "metadata": {**child_metadata(llmd), "name": config_map_name(llmd.metadata.name)},
        "data": {contract.ADAPTERS_FILE: json.dumps(payload, indent=1, sort_keys=True) + "\n"},
    }


def adapters_revision(config_map: Mapping[str, Any]) -> str:
    """A short digest of the desired adapter set in a rendered ConfigMap: what the operator
    writes on each engine pod (`names.ANNOTATION_ADAPTERS_REVISION`) when the set changes."""
    text = str((config_map.get("data") or {}).get(contract.ADAPTERS_FILE, ""))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_LORA_VALUE_FLAGS = (EngineFlag.MAX_LORAS, EngineFlag.MAX_CPU_LORAS, EngineFlag.MAX_LORA_RANK)


def started_lora_flags(workload: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The LoRA start flags (`lora_flags`) a rendered or live Deployment's engine container
    passes, in order; empty when LoRA is off or there is no Deployment."""
    template = ((workload or {}).get("spec") or {}).get("template") or {}
    found: list[str] = []
    for container in (template.get("spec") or {}).get("containers") or []:
        args = [str(a) for a in container.get("args") or []]
        for i, arg in enumerate(args):
            if arg == EngineFlag.ENABLE_LORA:
                found.append(arg)
            elif arg in _LORA_VALUE_FLAGS and i + 1 < len(args):
                found += [arg, args[i + 1]]
    return tuple(found)


def lora_restart_message(live: tuple[str, ...], desired: tuple[str, ...]) -> str | None:
    """Why a rollout restarts every replica, when it is because the LoRA start flags changed
    (vLLM reads them only at start); None when they did not."""
    if live == desired:
        return None
    if not live:
        return (
            "LoRA turned on (spec.engine.lora, or the first adapter): vLLM takes --enable-lora "
            "only at start, so every replica restarts in a drained rollout; adding or removing "
            "adapters later restarts nothing. Set spec.engine.lora when creating an "
            "LLMDeployment to avoid this rollout."
        )
    if not desired:
        return (
            "LoRA turned off (no spec.engine.lora and no adapter left): every replica restarts "
            "without --enable-lora in a drained rollout. Keep spec.engine.lora to remove the "
            "last adapter without one."
        )
    return (
        "The LoRA slots changed (spec.engine.lora: " + " ".join(desired[1:]) + "): vLLM reads "
        "them only at start, so every replica restarts in a drained rollout."
    )
