"""Pure: derive an LLMDeployment's status from its spec, the planner's verdict and the observed
child Deployment.

One function serves both the reconcile path and the child-event path, so the status is the same
whichever of them wrote it last. kstatus rules: `Ready=True` only when the current generation is
fully rolled out and every desired replica is ready; `Reconciling=True` while getting there;
`Stalled=True` (with a reason) for what will not fix itself without a human.

`Degraded=True` (abnormal-true, outside kstatus's three) names what is wrong with replicas
while the deployment serves or rolls out: a pod that cannot be scheduled or pulled, a container
crash-looping or recently restarted (OOMKilled, a failed liveness probe), a multi-node group
recreated or recreated in a loop (`llmop.group_restarts`), a Ready pod whose deep probe fails.
The agents' readings (`llmop.agents`) also give `status.plan.actual`; until this process has
read them, both keep what the previous status said, so an operator restart writes nothing new.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from llmop import adapter_preflight, adapter_status, agents, coldstart, conditions, kinds, names
from llmop.adapter_preflight import AdapterVerdict
from llmop.agents import AgentReading
from llmop.api.v1alpha1 import (
    ActualCapacity,
    AdapterRevision,
    AdapterStatus,
    LLMDeployment,
    LLMDeploymentSpec,
    LLMDeploymentStatus,
    ModelRevision,
    ObjectMeta,
    PlanStatus,
    PrePullStatus,
    RoutingStatus,
    ScaleToZeroStatus,
    StartupStatus,
)
from llmop.conditions import Observation
from llmop.group_restarts import GroupHistory, group_issue
from llmop.kinds import ChildKind
from llmop.model_revision import revisions_by_pod
from llmop.pods import PodIssue, degraded_issue, replica_pods, worst_issue, worst_of
from llmop.render.adapters import refusals
from llmop.router_view import RouterView, endpoint, router_issue
from llmop.sizing import SizingResult


@dataclass(frozen=True)
class Problem:
    """Something the operator cannot fix by retrying: the reason and a sentence for humans."""

    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    """One parent as one status write sees it, gathered once (`reconcile.writes.observe`) and
    handed whole to `derive_status`: who it is, its live children and pods, the agents'
    readings, the status as last written (parsed once), and the verdicts the status carries."""

    name: str
    namespace: str
    generation: int | None = None
    previous: LLMDeploymentStatus = field(default_factory=LLMDeploymentStatus)
    """The status as last written, parsed (`parse_previous`)."""
    stored: Any = None
    """The same status as stored (JSON), which `status_patch` compares the new one with."""
    children: Mapping[ChildKind, Mapping[str, Any] | None] = field(default_factory=dict)
    """The live children by kind (the workload: the spec's Deployment or LeaderWorkerSet)."""
    pods: Sequence[Mapping[str, Any]] = ()
    fleet: Sequence[AgentReading] | None = None
    """The agents' latest readings; None when this process has not read them yet."""
    problem: Problem | None = None
    """The caller's own stall reason (a child the API server rejected, or one remembered);
    planner and rollout problems are found by `derive_status`."""
    waiting: str | None = None
    """What the engine Deployment waits for before it is created (the model download), said by
    Ready and Reconciling instead of "Creating"."""
    router: RouterView | None = None
    """The installed router (None: none), whose URL is a routed CR's endpoint and whose lack of
    a ready pod makes it Degraded."""
    routing: Sequence[str] | None = None
    """The model names the operator decided this CR owns through the router
    (`llmop.name_owners`); None: not decided (no router, or not yet), the field is left out."""
    name_issue: PodIssue | None = None
    """Why the router does not route (some of) its names: ModelNameConflict or
    NamespaceNotServed."""
    inference_pool: str | None = None
    """The InferencePool the operator made (`llmop.pool_view`)."""
    pool_issue: PodIssue | None = None
    """Why the operator cannot make a wanted InferencePool."""
    adapter_verdicts: Mapping[str, AdapterVerdict | None] = field(default_factory=dict)
    """The Hub pre-flight's verdicts on the hf:// adapters (`llmop.adapter_preflight`; absent:
    none reached yet)."""
    group_restarts: Mapping[int, GroupHistory] = field(default_factory=dict)
    """What this process saw of each multi-node group's recreates (`llmop.group_restarts`)."""


@dataclass(frozen=True)
class Rollout:
    """What the child Deployment says about its rollout (all zero when it does not exist)."""

    exists: bool = False
    desired: int = 0
    current_generation_observed: bool = False
    template_current: bool = False
    replicas: int = 0
    ready: int = 0
    updated: int = 0
    available: int = 0
    deadline_exceeded: bool = False
    deadline_message: str = ""


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def observe_rollout(
    deployment: Mapping[str, Any] | None, spec: LLMDeploymentSpec, *, template_hash: str | None
) -> Rollout:
    """Read the live workload: the Deployment, or the LeaderWorkerSet whose status has the same
    fields counted in groups (a group is one replica). With autoscaling the HPA owns the count,
    so the desired replicas are the workload's own; otherwise they are the spec's."""
    if deployment is None:
        desired = spec.desired_fixed_replicas if spec.autoscaling is None else 0
        return Rollout(desired=desired)
    metadata = deployment.get("metadata") or {}
    dep_spec = deployment.get("spec") or {}
    dep_status = deployment.get("status") or {}
    if spec.autoscaling is None:
        desired = spec.desired_fixed_replicas
    else:
        # Deployments default spec.replicas to 1; the HPA then clamps it into [min, max]. Below
        # minReplicas is a moment (a new Deployment before its hand-over to minReplicas, or
        # before the HPA's next sync), never the goal: Ready waits for the floor.
        desired = max(_int(dep_spec.get("replicas", 1)), spec.autoscaling.min_replicas)
    progressing: Mapping[str, Any] = next(
        (c for c in dep_status.get("conditions") or [] if c.get("type") == "Progressing"), {}
    )
    live_hash = (metadata.get("annotations") or {}).get(names.ANNOTATION_TEMPLATE_HASH)
    return Rollout(
        exists=True,
        desired=_int(desired),
        current_generation_observed=(
            _int(dep_status.get("observedGeneration")) >= _int(metadata.get("generation"))
        ),
        template_current=template_hash is None or live_hash == template_hash,
        replicas=_int(dep_status.get("replicas")),
        ready=_int(dep_status.get("readyReplicas")),
        updated=_int(dep_status.get("updatedReplicas")),
        # A LeaderWorkerSet counts a group ready only when its leader and every worker are:
        # it has no separate "available" count.
        available=_int(
            dep_status.get("readyReplicas")
            if deployment.get("kind") == kinds.LEADER_WORKER_SET.kind
            else dep_status.get("availableReplicas")
        ),
        deadline_exceeded=(
            progressing.get("status") == "False"
            and progressing.get("reason") == conditions.REASON_PROGRESS_DEADLINE_EXCEEDED
        ),
        deadline_message=str(progressing.get("message") or ""),
    )


def find_problem(sizing: SizingResult | None, rollout: Rollout) -> Problem | None:
    """The reason the deployment is stuck for good, if any (the caller's own problems, such as
    an invalid spec, take precedence and are passed to `derive_status` directly)."""
    if sizing is not None and sizing.fits is False:
        return Problem(sizing.reason, sizing.message)
    if rollout.exists and rollout.deadline_exceeded:
        return Problem(
            conditions.REASON_PROGRESS_DEADLINE_EXCEEDED,
            rollout.deadline_message or "The engine Deployment exceeded its progress deadline.",
        )
    return None


def _progress(rollout: Rollout, waiting: tuple[str, str] | None = None) -> tuple[str, str] | None:
    """(reason, message) of why the rollout is not finished; None when it is. `waiting` is
    (reason, message) of what the engine Deployment waits for before it is created (the model
    download, or the model's files for its capacity plan)."""
    if not rollout.exists:
        if waiting is not None:
            return waiting
        return conditions.REASON_CREATING, "Creating the engine Deployment."
    if not (rollout.current_generation_observed and rollout.template_current):
        return conditions.REASON_ROLLING_OUT, "Rolling out the new engine template."
    if rollout.replicas > rollout.updated:
        return (
            conditions.REASON_ROLLING_OUT,
            f"{rollout.updated}/{rollout.desired} replicas updated, "
            f"{rollout.replicas - rollout.updated} old replicas remaining.",
        )
    if rollout.replicas != rollout.desired or rollout.updated < rollout.desired:
        return (
            conditions.REASON_SCALING,
            f"Scaling from {rollout.replicas} to {rollout.desired} replicas.",
        )
    if rollout.ready < rollout.desired or rollout.available < rollout.desired:
        return (
            conditions.REASON_WAITING_FOR_REPLICAS,
            f"{rollout.ready}/{rollout.desired} replicas ready.",
        )
    return None


def _capacity_observation(sizing: SizingResult | None, shortfall: str | None = None) -> Observation:
    if sizing is None:
        return Observation(
            conditions.CAPACITY_PLANNED,
            "Unknown",
            conditions.REASON_SPEC_UNREADABLE,
            "The spec could not be read, so no capacity plan was made.",
        )
    if sizing.fits is None:
        return Observation(conditions.CAPACITY_PLANNED, "Unknown", sizing.reason, sizing.message)
    if sizing.fits and shortfall is not None:
        # The plan holds (it fits); the engines just got less KV cache than it promised.
        return Observation(
            conditions.CAPACITY_PLANNED,
            "True",
            conditions.REASON_CAPACITY_SHORTFALL,
            f"{shortfall[0].upper()}{shortfall[1:]}. Plan: {sizing.message}",
        )
    if sizing.fits:
        return Observation(conditions.CAPACITY_PLANNED, "True", sizing.reason, sizing.message)
    return Observation(conditions.CAPACITY_PLANNED, "False", sizing.reason, sizing.message)


def degraded_observation(issue: PodIssue | None) -> Observation:
    """Degraded (abnormal-true): the issue's reason and message, or AsExpected."""
    if issue is None:
        return Observation(
            conditions.DEGRADED, "False", conditions.REASON_AS_EXPECTED, "No replica problems seen."
        )
    return Observation(conditions.DEGRADED, "True", issue.reason, issue.message)


def observe_conditions(
    rollout: Rollout,
    problem: Problem | None,
    sizing: SizingResult | None,
    pod_issue: PodIssue | None = None,
    *,
    degraded: Observation | None = None,
    shortfall: str | None = None,
    waiting: str | None = None,
) -> list[Observation]:
    """Ready, Reconciling, Stalled and CapacityPlanned, in that order, then `degraded` when
    given. While the rollout is not done, a pod's problem (unschedulable, image pull, crash
    loop) names the cause: Ready's reason becomes it and both messages say which pod and why.
    `waiting`: what the engine Deployment waits for before it exists (the model download)."""
    observations = _observe(rollout, problem, sizing, pod_issue, shortfall, waiting=waiting)
    return observations if degraded is None else [*observations, degraded]


def _observe(
    rollout: Rollout,
    problem: Problem | None,
    sizing: SizingResult | None,
    pod_issue: PodIssue | None,
    shortfall: str | None,
    *,
    waiting: str | None,
) -> list[Observation]:
    capacity = _capacity_observation(sizing, shortfall)
    if problem is not None:
        return [
            Observation(conditions.READY, "False", problem.reason, problem.message),
            Observation(
                conditions.RECONCILING,
                "False",
                conditions.REASON_STALLED,
                "Stalled: waiting for the spec to change.",
            ),
            Observation(conditions.STALLED, "True", problem.reason, problem.message),
            capacity,
        ]
    not_stalled = Observation(conditions.STALLED, "False", conditions.REASON_AS_EXPECTED)
    pending = None if waiting is None else (conditions.REASON_DOWNLOADING_MODEL, waiting)
    if sizing is not None and sizing.waiting:
        # No plan yet: nothing is created until the model's files are read (llmop.model_facts).
        pending = (sizing.reason, sizing.message)
    progress = _progress(rollout, pending)
    if progress is not None:
        reason, message = progress
        ready_reason = reason
        if pod_issue is not None:
            ready_reason = pod_issue.reason
            message = f"{message} {pod_issue.reason}: {pod_issue.message}"
        return [
            Observation(conditions.READY, "False", ready_reason, message),
            Observation(conditions.RECONCILING, "True", reason, message),
            not_stalled,
            capacity,
        ]
    if rollout.desired == 0:
        ready = Observation(
            conditions.READY, "True", conditions.REASON_SCALED_TO_ZERO, "Scaled to zero replicas."
        )
    else:
        ready = Observation(
            conditions.READY,
            "True",
            conditions.REASON_ALL_REPLICAS_READY,
            f"{rollout.ready}/{rollout.desired} replicas ready.",
        )
    return [
        ready,
        Observation(conditions.RECONCILING, "False", conditions.REASON_AS_EXPECTED, "Rolled out."),
        not_stalled,
        capacity,
    ]


def derive_status(
    observed: Observed,
    spec: LLMDeploymentSpec,
    sizing: SizingResult | None,
    *,
    template_hash: str | None,
    now: datetime,
) -> LLMDeploymentStatus:
    """The whole status of a parsed LLMDeployment (`spec`, its capacity plan `sizing` and its
    rendered pod template's hash) from what one write observed. The live workload is the
    LeaderWorkerSet for a multi-node spec, else the Deployment; the live HPA counts only for an
    autoscaled spec, whose conditions say when it cannot scale."""
    name, namespace, previous = observed.name, observed.namespace, observed.previous
    generation, pods, fleet = observed.generation, list(observed.pods), observed.fleet
    router = observed.router
    multi_node = spec.pipeline_parallel_size > 1
    deployment = observed.children.get(kinds.LEADER_WORKER_SET if multi_node else kinds.DEPLOYMENT)
    hpa = observed.children.get(kinds.HPA) if spec.autoscaling is not None else None
    own_endpoint = names.service_endpoint(name, namespace, spec.service.port)
    routed = spec.router.enabled
    rollout = observe_rollout(deployment, spec, template_hash=template_hash)
    problem = observed.problem or find_problem(sizing, rollout) or _needs_router(spec, router)
    plan = None if sizing is None else sizing.plan_status()
    actual = _actual(previous, fleet)
    if sizing is not None and actual is not None:
        # Also without a plan (GPU memory unknown): then the reported figure is all there is.
        plan = (plan or PlanStatus()).model_copy(update={"actual": actual})
    shortfall = agents.capacity_shortfall(
        None if plan is None else plan.kv_cache_tokens,
        None if actual is None else actual.kv_cache_tokens,
    )
    groups = group_issue(observed.group_restarts, pods, size=spec.pipeline_parallel_size, now=now)
    observations = observe_conditions(
        rollout,
        problem,
        sizing,
        worst_of([worst_issue(pods), groups]),
        degraded=degraded_observation(
            _degraded_issue(previous, pods, fleet, now, groups)
            or autoscaler_issue(hpa, rollout.ready)
            or observed.name_issue
            or router_issue(
                router,
                routed,
                own_endpoint,
                engine_key=spec.service.api_key_secret_ref is not None,
            )
            or observed.pool_issue
        ),
        shortfall=shortfall,
        waiting=observed.waiting,
    )
    adapters, adapter_revisions = _adapters(
        name, namespace, spec, pods, fleet, verdicts=observed.adapter_verdicts
    )
    adapters_condition = adapter_status.adapters_ready(adapters)
    if adapters_condition is not None:
        observations.append(adapters_condition)
    return LLMDeploymentStatus(
        observed_generation=generation,
        replicas=rollout.replicas,
        ready_replicas=rollout.ready,
        updated_replicas=rollout.updated,
        selector=names.selector_string(name),
        replica_summary=f"{rollout.ready}/{rollout.desired}",
        endpoint=endpoint(router, routed, own_endpoint),
        conditions=conditions.merge(
            previous.conditions, observations, generation=generation, now=now
        ),
        plan=plan,
        startup=_startup(previous, replica_pods(pods), fleet),
        pre_pull=pre_pull_status(spec, observed.children.get(kinds.PRE_PULL), name, namespace),
        inference_pool=observed.inference_pool,
        scale_to_zero=scale_to_zero_status(previous, spec, rollout, now),
        adapters=adapters,
        adapters_summary=adapter_status.summary(adapters),
        group_summary=group_summary(spec, rollout),
        routing=None
        if observed.routing is None or not routed
        else RoutingStatus(
            served_names=list(observed.routing),
            model_revisions=[
                ModelRevision(revision=revision, pods=served)
                for revision, served in revisions_by_pod(pods).items()
            ],
            adapter_revisions=adapter_revisions,
        ),
    )


def pre_pull_status(
    spec: LLMDeploymentSpec, daemon_set: Mapping[str, Any] | None, name: str, namespace: str
) -> PrePullStatus | None:
    """On how many of the engine pods' nodes the current engine image is (a ready pre-pull pod
    of the current template); None without `spec.scheduling.prePullImage`."""
    if not spec.scheduling.pre_pull_image:
        return None
    daemon_set_name = name + kinds.PRE_PULL.name_suffix
    if daemon_set is None:
        return PrePullStatus(message=f"creating DaemonSet {daemon_set_name}")
    generation = (daemon_set.get("metadata") or {}).get("generation")
    live = daemon_set.get("status") or {}
    nodes = _int(live.get("desiredNumberScheduled"))
    if isinstance(generation, int) and _int(live.get("observedGeneration")) < generation:
        return PrePullStatus(nodes=nodes, message=f"DaemonSet {daemon_set_name} is updating")
    pulled = min(_int(live.get("numberReady")), _int(live.get("updatedNumberScheduled")))
    if nodes == 0:
        message = "no node matches the engine pods' node selector, GPU product and tolerations"
    else:
        message = f"image on {pulled} of {nodes} nodes"
    if nodes > 0 and pulled < nodes:
        pods = f"{names.LABEL_INSTANCE}={name},{names.LABEL_COMPONENT}={names.PRE_PULL_COMPONENT}"
        message += f"; pulling or failing: kubectl get pods -n {namespace} -l {pods}"
    return PrePullStatus(nodes=nodes, pulled=pulled, message=message)


def group_summary(spec: LLMDeploymentSpec, rollout: Rollout) -> str | None:
    """`ready/desired (N pods each)` of a multi-node LLMDeployment's groups (`-o wide`); None
    for one pod per replica."""
    if spec.pipeline_parallel_size <= 1:
        return None
    return f"{rollout.ready}/{rollout.desired} ({spec.pipeline_parallel_size} pods each)"


def _adapters(
    name: str,
    namespace: str,
    spec: LLMDeploymentSpec,
    pods: Sequence[Mapping[str, Any]],
    fleet: Sequence[AgentReading] | None,
    *,
    verdicts: Mapping[str, AdapterVerdict | None],
) -> tuple[list[AdapterStatus] | None, list[AdapterRevision] | None]:
    """status.adapters from the agents' reports (every adapter Pending until they are read),
    the operator's own refusals and the Hub pre-flight's (resolved commit, rank); and
    status.routing.adapterRevisions from the same (`adapter_status.routing_revisions`)."""
    if not spec.adapters:
        return None, None
    ready = {
        str((pod.get("metadata") or {}).get("name")) for pod in replica_pods(pods) if _ready(pod)
    }
    reports = [adapter_status.PodReport(r.pod, r.adapters) for r in fleet or ()]
    llmd = LLMDeployment(metadata=ObjectMeta(name=name, namespace=namespace), spec=spec)
    refused = refusals(llmd) | adapter_preflight.refused(verdicts)
    statuses = adapter_preflight.with_verdicts(
        adapter_status.adapter_statuses(spec, refused, reports, ready), verdicts
    )
    return statuses, adapter_status.routing_revisions(statuses, reports, ready)


def _needs_router(spec: LLMDeploymentSpec, router: RouterView | None) -> Problem | None:
    """A model that may scale to zero needs llmop-router to hold its first request and wake
    it; without one installed it would stay at zero, unreachable."""
    if spec.autoscaling is None or not spec.autoscaling.scales_to_zero or router is not None:
        return None
    return Problem(
        conditions.REASON_ROUTER_UNAVAILABLE,
        "spec.autoscaling.minReplicas is 0 but no llmop-router is installed to wake the model: "
        "install the chart with router.enabled=true, or set spec.autoscaling.minReplicas to 1.",
    )


def _at_zero(previous: LLMDeploymentStatus) -> bool:
    ready = conditions.find(previous.conditions, conditions.READY)
    return (
        ready is not None
        and ready.status == "True"
        and ready.reason == conditions.REASON_SCALED_TO_ZERO
    )


def scale_to_zero_status(
    previous: LLMDeploymentStatus, spec: LLMDeploymentSpec, rollout: Rollout, now: datetime
) -> ScaleToZeroStatus | None:
    """When the model last went to zero and woke, from what the previous status said and the
    workload shows now: entering zero stamps `lastScaledToZeroTime`; leaving it (the router
    set the scale to 1) stamps `lastWakeTime`; the first ready replica after that gives
    `lastWakeSeconds` — 0 when the replica is ready already as the wake is first seen (one
    derivation reaches what two would: a pass that sees the wake and the ready replica at once,
    as a merged burst of triggers does, needs no later trigger to finish the record)."""
    if spec.autoscaling is None or not spec.autoscaling.scales_to_zero:
        return None
    before = previous.scale_to_zero or ScaleToZeroStatus()
    at_zero = rollout.exists and rollout.desired == 0
    was_zero = _at_zero(previous)
    stamp = conditions.format_time(now)
    if at_zero and not was_zero:
        return before.model_copy(update={"last_scaled_to_zero_time": stamp})
    if was_zero and not at_zero:
        seconds = 0.0 if rollout.ready else None
        return before.model_copy(update={"last_wake_time": stamp, "last_wake_seconds": seconds})
    woke = conditions.parse_time(before.last_wake_time)
    if not at_zero and woke is not None and before.last_wake_seconds is None and rollout.ready:
        seconds = round(max(0.0, (now - woke).total_seconds()), 1)
        return before.model_copy(update={"last_wake_seconds": seconds})
    return previous.scale_to_zero


def _startup(
    previous: LLMDeploymentStatus,
    pods: Sequence[Mapping[str, Any]],
    fleet: Sequence[AgentReading] | None,
) -> StartupStatus | None:
    """The cold-start breakdown; before the first agent read, the agent phases (Downloading,
    Loading) the previous status showed stand."""
    known = {}
    if fleet is None and previous.startup is not None:
        known = {r.pod: r for r in previous.startup.replicas}
    return coldstart.startup_status(pods, fleet or (), known)


def _actual(
    previous: LLMDeploymentStatus, fleet: Sequence[AgentReading] | None
) -> ActualCapacity | None:
    """What the engines report; before the first read, what the previous status said."""
    if fleet is None:
        return previous.plan.actual if previous.plan is not None else None
    tokens = agents.actual_kv_tokens(fleet)
    return None if tokens is None else ActualCapacity(kv_cache_tokens=tokens)


def _ready(pod: Mapping[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all(c.get("ready") for c in statuses)


def _degraded_issue(
    previous: LLMDeploymentStatus,
    pods: Sequence[Mapping[str, Any]],
    fleet: Sequence[AgentReading] | None,
    now: datetime,
    groups: PodIssue | None = None,
) -> PodIssue | None:
    """The pods' and the groups' own problems first (they explain more; `pods.worst_of` ranks a
    group's restart loop above every pod issue); then failing deep probes, which only the
    agents know: before the first read, a DeepProbeFailing verdict of the previous status
    stands (an operator restart neither clears nor repeats it)."""
    issue = worst_of([degraded_issue(pods, now), groups])
    if issue is not None:
        return issue
    if fleet is not None:
        ready = [
            str((p.get("metadata") or {}).get("name")) for p in replica_pods(pods) if _ready(p)
        ]
        return agents.probe_issue(fleet, ready)
    before = conditions.find(previous.conditions, conditions.DEGRADED)
    if (
        before is not None
        and before.status == "True"
        and before.reason == conditions.REASON_DEEP_PROBE_FAILING
    ):
        return PodIssue(before.reason, before.message, "")
    return None


# ScalingActive=False with this reason is the HPA idling on purpose (its target has 0 replicas).
_HPA_BENIGN = {("ScalingActive", "ScalingDisabled")}


def autoscaler_issue(hpa: Mapping[str, Any] | None, ready_replicas: int) -> PodIssue | None:
    """The HPA's own word when it cannot scale (ScalingActive or AbleToScale False): without it
    an autoscaled deployment silently never scales, e.g. when no custom metrics API serves the
    queue-depth metric.

    Not while no replica is ready: a loading engine exports no queue depth (docs/operations.md,
    "Loading replicas and the HPA"), so with every replica loading the custom metrics API has no
    item and the HPA reports FailedGetPodsMetric ("no metrics returned from custom metrics API")
    by design; Ready/Progressing already say the replicas are loading."""
    if hpa is None:
        return None
    for c in (hpa.get("status") or {}).get("conditions") or ():
        kind, reason = str(c.get("type")), str(c.get("reason") or "")
        if kind in ("ScalingActive", "AbleToScale") and c.get("status") == "False":
            if (kind, reason) in _HPA_BENIGN:
                continue
            if ready_replicas == 0 and (kind, reason) == ("ScalingActive", "FailedGetPodsMetric"):
                continue
            name = (hpa.get("metadata") or {}).get("name")
            return PodIssue(
                conditions.REASON_AUTOSCALER_INACTIVE,
                f"HorizontalPodAutoscaler {name} cannot scale ({kind}=False, {reason}): "
                f"{c.get('message') or 'no message'}. Check that the custom metrics API "
                "(prometheus-adapter) serves llmop_engine_queue_depth for these pods.",
                "",
            )
    return None


def derive_invalid_status(
    *,
    name: str,
    generation: int | None,
    previous: LLMDeploymentStatus,
    problem: Problem,
    now: datetime,
) -> LLMDeploymentStatus:
    """Status of an LLMDeployment whose spec cannot be read: Stalled, replica counts kept."""
    observations = observe_conditions(Rollout(), problem, None)
    return LLMDeploymentStatus(
        observed_generation=generation,
        replicas=previous.replicas,
        ready_replicas=previous.ready_replicas,
        updated_replicas=previous.updated_replicas,
        selector=names.selector_string(name),
        replica_summary=previous.replica_summary,
        group_summary=previous.group_summary,
        inference_pool=previous.inference_pool,  # still there: the parent path deletes it
        conditions=conditions.merge(
            previous.conditions, observations, generation=generation, now=now
        ),
    )


def parse_previous(raw: Any) -> LLMDeploymentStatus:
    """The status as stored; an unreadable one counts as empty (it is rewritten whole)."""
    if not isinstance(raw, Mapping):
        return LLMDeploymentStatus()
    try:
        return LLMDeploymentStatus.model_validate(raw)
    except ValueError:
        return LLMDeploymentStatus()


def dump(status: LLMDeploymentStatus) -> dict[str, Any]:
    """The status as it goes on the wire."""
    return status.model_dump(by_alias=True, exclude_none=True, mode="json")


def status_patch(raw_previous: Any, status: LLMDeploymentStatus) -> dict[str, Any] | None:
    """A merge patch for `/status` that turns the stored status into `status`, or None when
    they are equal (so an unchanged status is never written). Keys that disappear are nulled,
    and lists (conditions) are replaced whole, as merge patches do."""
    wanted = dump(status)
    previous = raw_previous if isinstance(raw_previous, Mapping) else {}
    if _same(previous, wanted):
        return None
    patch: dict[str, Any] = {key: None for key in previous if key not in wanted}
    patch.update(wanted)
    return patch


def _same(stored: Any, wanted: Any) -> bool:
    """JSON equality, except that 80 and 80.0 are one number (the API server drops `.0`)."""
    if isinstance(stored, Mapping) and isinstance(wanted, Mapping):
        return stored.keys() == wanted.keys() and all(_same(stored[k], wanted[k]) for k in wanted)
    if isinstance(stored, list) and isinstance(wanted, list):
        return len(stored) == len(wanted) and all(map(_same, stored, wanted))
    return bool(stored == wanted)
