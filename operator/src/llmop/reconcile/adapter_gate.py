"""The adapter pre-flight on the parent path: ask the Hub about each hf:// adapter whose source,
revision or token changed (`hub.adapter_probe`), remember the answers in the parent's
`ParentMemory.adapter_gates`, and hand every path the verdicts (`adapter_preflight.judge`) — the
ConfigMap without the refused adapters and with the accepted ones pinned to their commit
(`applied`), and status (`verdicts_for`, read by `writes`).

Adapters never gate the engine children: a refusal only keeps that adapter from the pods, and a
Hub that cannot be reached leaves the adapter unjudged (the pods get it as declared) until a
later parent pass asks again (`UNREACHABLE_RETRY`; `llmop.hub_check` runs one when nothing
else does). The Hub is asked on the parent path only;
the child, pod and fleet paths read the remembered answers, without I/O.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
from collections.abc import Collection, Mapping
from datetime import timedelta
from typing import Any

from llmop import adapter_preflight, events, hub, kinds, names, preflight
from llmop.adapter_preflight import Accepted, AdapterFacts, AdapterVerdict
from llmop.api.v1alpha1 import AdapterSpec, LLMDeployment, LLMDeploymentSpec
from llmop.desired import DesiredState
from llmop.kube import KubeError
from llmop.plan import ChildPlan
from llmop.preflight import HubFailure
from llmop.reconcile.caches import key_of
from llmop.reconcile.context import AdapterGates, Context, Parsed, post_event
from llmop.render.adapters import (
    Refusal,
    adapters_revision,
    hub_repo,
    lora_restart_message,
    render_config_map,
    started_lora_flags,
)

log = logging.getLogger("llmop.reconcile.adapter_gate")

UNREACHABLE_RETRY = timedelta(seconds=30)
"""After the Hub could not be reached, parent passes of the same generation within this long ask
nothing (a new generation asks at once): a download's progress polls run a parent pass every few
seconds, and each would otherwise hold the parent's lock for a Hub timeout."""


def _token_secret(spec: LLMDeploymentSpec) -> str | None:
    ref = spec.model.token_secret_ref
    return None if ref is None else f"{ref.name}/{ref.key}"


def _token(ctx: Context, namespace: str, llmd: LLMDeployment) -> str | None:
    """The model's token, read as the model gate reads it. A missing Secret or key asks
    anonymously: a public adapter still passes, and a gated one is refused naming the Secret
    (the model's own checks report the missing Secret as the model's problem)."""
    ref = llmd.spec.model.token_secret_ref
    if ref is None:
        return None
    secret = ctx.kube.read("v1", kinds.SECRET.kind, namespace, ref.name)
    data = (secret or {}).get("data") or {}
    if ref.key not in data:
        return None
    return base64.b64decode(data[ref.key]).decode().strip()


class _Token:
    """The model's token, read from its Secret at most once per pass and only when the Hub is
    asked at all (a pass with nothing new to ask reads no Secret)."""

    def __init__(self, ctx: Context, namespace: str, llmd: LLMDeployment) -> None:
        self._args = (ctx, namespace, llmd)
        self._read = False
        self._value: str | None = None

    def get(self) -> str | None:
        if not self._read:
            self._value, self._read = _token(*self._args), True
        return self._value


def due_for_hub(ctx: Context) -> list[tuple[str, str]]:
    """The parents whose last pre-flight could not reach the Hub `UNREACHABLE_RETRY` ago or
    more: their next parent pass asks again (`llmop.hub_check` runs it). No I/O."""
    now = ctx.clock()
    return [
        key
        for key, memory in ctx.memories()
        if (gates := memory.adapter_gates) is not None
        and gates.unreachable_at is not None
        and now - gates.unreachable_at >= UNREACHABLE_RETRY
    ]


def check(ctx: Context, body: Mapping[str, Any], parsed: Parsed) -> None:
    """The parent path's pre-flight of the hf:// adapters: ask the Hub about each adapter it
    has no answer for (new, or its source, revision or token ref changed; a refusal also on a
    new generation, as access may have been granted since), then about the base model's
    `model_type` when an adapter's config is there to check against it. Stops at the first
    unreachable answer (the Hub is down: the rest would time out too); the next parent pass
    asks again. A newly accepted adapter on a floating revision gets a FloatingRevision
    Warning Event (once per answer, so at most once per generation)."""
    assert parsed.desired is not None
    llmd = parsed.desired.llmd
    key = key_of(body)
    wanted = [a for a in llmd.spec.adapters if hub_repo(a) is not None]
    if not wanted:
        ctx.update(key, lambda memory: dataclasses.replace(memory, adapter_gates=None))
        return
    gates = ctx.recall(key).adapter_gates
    if gates is None or gates.uid != parsed.uid:
        gates = started = AdapterGates(parsed.uid, parsed.generation)
        ctx.update(key, lambda memory: dataclasses.replace(memory, adapter_gates=started))
    new_generation = gates.generation != parsed.generation
    gates.generation = parsed.generation
    now = ctx.clock()
    if (
        not new_generation
        and gates.unreachable_at is not None
        and now - gates.unreachable_at < UNREACHABLE_RETRY
    ):
        return  # a download's progress polls come every few seconds: not each one waits on it
    names = {a.name for a in wanted}
    for gone in [name for name in gates.answers if name not in names]:
        del gates.answers[gone]
    token_secret = _token_secret(llmd.spec)
    token = _Token(ctx, key[0], llmd)
    # A refusal is asked again on a new generation (access may have been granted since, or a
    # branch fixed); an accepted adapter keeps its answer, and its commit, while its question
    # stands, so a `kubectl scale` never moves it to a newer commit behind the user's back.
    recheck = {
        name
        for name, judged in verdicts_for(ctx, body, llmd.spec).items()
        if new_generation and isinstance(judged, Refusal)
    }
    fresh, reached = _ask_adapters(
        ctx, key, gates, wanted, token_secret=token_secret, token=token, recheck=recheck
    )
    if reached and not _ask_base(ctx, gates, llmd, token_secret, token=token):
        log.warning("%s/%s: the base model's type is unknown, the hub cannot be reached", *key)
        reached = False
    gates.unreachable_at = None if reached else now
    verdicts = verdicts_for(ctx, body, llmd.spec)
    for name in fresh:
        judged = verdicts.get(name)
        if isinstance(judged, Accepted) and judged.floating:
            post_event(
                ctx,
                body,
                events.EventSpec("Warning", preflight.REASON_FLOATING_REVISION, judged.message),
            )
        elif judged is not None and not isinstance(judged, Accepted):
            log.info("%s/%s: adapter %s refused: %s: %s", *key, name, judged.reason, judged.message)


def _ask_adapters(
    ctx: Context,
    key: tuple[str, str],
    gates: AdapterGates,
    wanted: list[AdapterSpec],
    *,
    token_secret: str | None,
    token: _Token,
    recheck: Collection[str],
) -> tuple[list[str], bool]:
    """Ask the Hub about each adapter whose remembered answer is not for what the spec asks
    now, or is in `recheck`: the names answered now, and False when the Hub could not be
    reached (the adapters after that one are not asked)."""
    fresh: list[str] = []
    for adapter in wanted:
        asked = adapter_preflight.asked_for(adapter, token_secret)
        stored = gates.answers.get(adapter.name)
        if stored is not None and stored[0] == asked and adapter.name not in recheck:
            continue
        answer = hub.adapter_probe(
            hub_repo(adapter) or "",
            adapter.revision,
            token=token.get(),
            endpoint=ctx.render_settings.hub_endpoint,
        )
        if isinstance(answer, HubFailure) and answer.kind == "unreachable":
            log.warning(
                "%s/%s: adapter %s not checked, the hub cannot be reached: %s",
                *key,
                adapter.name,
                answer.detail,
            )
            return fresh, False
        gates.answers[adapter.name] = (asked, answer)
        fresh.append(adapter.name)
    return fresh, True


def _ask_base(
    ctx: Context,
    gates: AdapterGates,
    llmd: LLMDeployment,
    token_secret: str | None,
    *,
    token: _Token,
) -> bool:
    """Ask the Hub for the base model's `model_type` when an adapter's config is there to
    check and the base was not asked as the spec has it now; False when the Hub cannot be
    reached (the target modules go unchecked until a later pass asks again)."""
    asked = adapter_preflight.base_asked_for(llmd.spec, token_secret)
    if asked is None or (gates.base is not None and gates.base[0] == asked):
        return True
    if not any(
        isinstance(answer, AdapterFacts) and answer.adapter_config is not None
        for _, answer in gates.answers.values()
    ):
        return True
    found = hub.model_type(
        llmd.spec.model.name,
        llmd.spec.model.revision,
        token=token.get(),
        endpoint=ctx.render_settings.hub_endpoint,
    )
    if isinstance(found, HubFailure):
        if found.kind == "unreachable":
            return False
        found = None  # the base's own checks name why; for the adapters it is only unknown
    gates.base = (asked, found)
    return True


def verdicts_for(
    ctx: Context, body: Mapping[str, Any], spec: LLMDeploymentSpec
) -> dict[str, AdapterVerdict | None]:
    """The verdict of each hf:// adapter of `spec`, from what the parent path's pre-flight
    remembered for this parent (None: not judged; empty when never asked). No I/O."""
    gates = ctx.recall(key_of(body)).adapter_gates
    if gates is None or gates.uid != body["metadata"].get("uid"):
        return {}
    token_secret = _token_secret(spec)
    base = adapter_preflight.base_asked_for(spec, token_secret)
    base_model_type = gates.base[1] if gates.base is not None and gates.base[0] == base else None
    return adapter_preflight.judge(
        spec, gates.answers, base_model_type=base_model_type, token_secret=token_secret
    )


def applied(ctx: Context, body: Mapping[str, Any], desired: DesiredState) -> DesiredState:
    """`desired` with the adapters' ConfigMap re-rendered from the pre-flight's verdicts:
    refused adapters left out, accepted ones pinned to their resolved commit. Every path that
    plans the ConfigMap uses it, so the child path's repair never puts back what the parent
    path left out. No I/O."""
    children = desired.children
    if children is None or children.adapters is None:
        return desired
    verdicts = verdicts_for(ctx, body, desired.llmd.spec)
    refused = adapter_preflight.refused(verdicts)
    pinned = adapter_preflight.pinned(verdicts)
    if not refused and not pinned:
        return desired
    config_map = render_config_map(desired.llmd, refused=refused, pinned=pinned)
    return desired.with_children(dataclasses.replace(children, adapters=config_map))


def nudge_pods(
    ctx: Context, body: Mapping[str, Any], plan: ChildPlan, *, undone_edit: str | None = None
) -> int:
    """After `plan` applied the adapters ConfigMap: write its revision on each engine pod that
    does not carry it yet. The annotation change makes the kubelet sync the pod, and a pod sync
    refreshes its ConfigMap volumes, so the agents see a new adapter set within seconds instead
    of on the kubelet's periodic sync (a minute or more; measured 86 s). When the plan undid an
    out-of-band edit of the ConfigMap (`undone_edit`: the edit's resourceVersion), pods that
    already name the revision are written too, as `<revision>.<edit>`: their kubelets may have
    delivered the edited set, and only a pod change brings the repaired one back at once.
    Returns the pods written; a failed write is only logged: the periodic sync still delivers
    the set."""
    config_map = next((a.manifest for a in plan.applies if a.kind == kinds.CONFIG_MAP.kind), None)
    if config_map is None:
        return 0
    revision = adapters_revision(config_map)
    value = revision if undone_edit is None else f"{revision}.{undone_edit}"
    namespace, name = key_of(body)
    written = 0
    for pod in list(ctx.pods.get((namespace, name)) or ()):
        metadata = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        if metadata.get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
            continue
        named = str((metadata.get("annotations") or {}).get(names.ANNOTATION_ADAPTERS_REVISION))
        if named == value or (undone_edit is None and named.partition(".")[0] == revision):
            continue
        try:
            ctx.kube.patch_annotations(
                kinds.POD.api_version,
                kinds.POD.kind,
                namespace,
                str(metadata.get("name")),
                {names.ANNOTATION_ADAPTERS_REVISION: value},
            )
            written += 1
        except KubeError as error:
            log.warning(
                "could not tell pod %s about the new adapter set: %s", metadata.get("name"), error
            )
    return written


REASON_LORA_ROLLOUT = "LoRARollout"


def note_lora_rollout(
    ctx: Context, body: Mapping[str, Any], live: Mapping[str, Any] | None, plan: ChildPlan
) -> None:
    """After `plan` applied a new Deployment over `live`: a Normal Event when the LoRA start
    flags changed, since that restarts every replica (turning LoRA on for the first time, most
    often) while adapter changes restart none; the message says how to avoid it."""
    desired = next((a.manifest for a in plan.applies if a.kind == kinds.DEPLOYMENT.kind), None)
    if desired is None or live is None:
        return
    message = lora_restart_message(started_lora_flags(live), started_lora_flags(desired))
    if message is not None:
        post_event(ctx, body, events.EventSpec("Normal", REASON_LORA_ROLLOUT, message))
