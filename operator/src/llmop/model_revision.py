"""Pure: which model revision an engine pod serves, for the router's stream migration.

The router continues a stream cut mid-answer on another replica by sending it the prompt's and
the generated token ids (docs/router.md, "Request migration"). Token ids mean the same thing, and a
greedy continuation is the one the first replica would have produced, only on a replica that
loaded the same weights and tokenizer the same way. During a rollout that changes the model
(another repository, revision, tokenizer, dtype or quantization) both kinds of pods serve one
LLMDeployment, so the operator writes which pods serve which revision into
`status.routing.modelRevisions` and the router continues a stream only on a pod of the revision
that started it.

A revision is a short hash of the engine flags that decide the tokens, read from the pod's own
engine container (not from the CR: during a rollout the CR says only what the new pods run).
The image (the vLLM version) and every other flag are left out: they change speed and memory,
not what a token id means. Worker pods of a multi-node group serve no API and get none.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from llmop import names
from llmop_engine import contract

REVISION_FLAGS = (
    "--revision",
    "--tokenizer",
    "--tokenizer-revision",
    "--tokenizer-mode",
    "--dtype",
    "--quantization",
    "--hf-overrides",
)
"""The engine flags, besides the model, that change which tokens a greedy request gets."""
SUMMARY_FIELD = "llmopModelRevision"
"""Where a pod summary in the watch cache (`llmop.pods.pod_summary`, which keeps no spec)
carries the pod's revision."""
MAX_PODS = 2000
"""Pods listed in the status at most (1,000 replicas, a full surge): a pod past it is just not a
target for a migrated stream."""
MAX_REVISIONS = 64
"""Revisions listed at most (one per pod template a rollout left running)."""


def engine_flags_of(pod: Mapping[str, Any]) -> list[str] | None:
    """The engine flags of the pod's engine container (after the agent's `--`); None when it
    has none."""
    for container in ((pod.get("spec") or {}).get("containers")) or []:
        if container.get("name") == names.ENGINE_CONTAINER:
            args = [str(a) for a in container.get("args") or []]
            flags = contract.split_engine_args(args)[1]
            return flags or None
    return None


def revision_of_flags(flags: list[str]) -> str:
    """The model revision of an engine command line: its model (the first argument) and the
    values of `REVISION_FLAGS`, hashed."""
    model = flags[0]
    found: dict[str, str] = {}
    for i, arg in enumerate(flags[1:], start=1):
        flag, eq, value = arg.partition("=")
        if flag not in REVISION_FLAGS:
            continue
        if eq:
            found[flag] = value
        elif i + 1 < len(flags):
            found[flag] = flags[i + 1]
    text = json.dumps([model, sorted(found.items())], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def model_revision(pod: Mapping[str, Any]) -> str | None:
    """The revision a pod serves; None for a worker of a multi-node group (it serves no API)
    or a pod without an engine container."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if labels.get(names.LABEL_LWS_WORKER_INDEX, "0") != "0":
        return None
    flags = engine_flags_of(pod)
    return None if flags is None else revision_of_flags(flags)


def revisions_by_pod(pods: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """revision → the names of the pods serving it, from pod summaries (`SUMMARY_FIELD`),
    names sorted, at most `MAX_PODS` pods and `MAX_REVISIONS` revisions in all."""
    found: dict[str, list[str]] = {}
    for pod in pods:
        revision = pod.get(SUMMARY_FIELD)
        name = (pod.get("metadata") or {}).get("name")
        if isinstance(revision, str) and isinstance(name, str):
            found.setdefault(revision, []).append(name)
    room = MAX_PODS
    out: dict[str, list[str]] = {}
    for revision in sorted(found)[:MAX_REVISIONS]:
        kept = sorted(found[revision])[:room]
        room -= len(kept)
        if kept:
            out[revision] = kept
    return out
