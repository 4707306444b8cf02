"""The one registry of the kinds the operator touches: its children and the few others.

The renderers name their output kinds from it, the child plan orders applies and deletes by it,
`llmop.kube` builds request paths from its plurals, the kopf handlers watch the kinds it marks
as watched, and the RBAC tests derive the verbs the operator needs from it. Adding a child kind
is one entry here (plus its renderer), not four tables.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmop import names
from llmop.api.v1alpha1 import API_VERSION, KIND, PLURAL
from llmop_router import contract


@dataclass(frozen=True)
class Kind:
    """An API kind and how the operator uses it."""

    api_version: str
    kind: str
    plural: str

    @property
    def group(self) -> str:
        """The API group ("" for the core group)."""
        return self.api_version.rpartition("/")[0]


@dataclass(frozen=True)
class ChildKind(Kind):
    """A kind the operator renders for each LLMDeployment (named like its parent)."""

    watched: bool = True
    """Watched (label-filtered) for status and drift. Kinds whose CRD may be absent are not
    (ServiceMonitor, InferencePool): they are applied, and an InferencePool is deleted where
    status.inferencePool says the operator made one."""
    optional: bool = False
    """Deleted when the spec stops wanting it (an HPA when autoscaling turns off)."""
    read: bool = False
    """Read fresh before a plan (the Deployment: the HPA handover needs its current owners)."""
    listed: bool = False
    """Listed by a poller instead of watched (the LeaderWorkerSet: its CRD may be absent)."""
    workload: bool = False
    """One of the two workload kinds: the one the spec stops wanting is deleted after the other
    is applied (pipelineParallelSize switched between 1 and more)."""
    name_suffix: str = ""
    """Appended to the parent's name (the adapters ConfigMap is `<name>-adapters`)."""

    def verbs(self) -> frozenset[str]:
        """The RBAC verbs this use needs: server-side apply is create + patch, and list by name
        when a create finds an object in the way (`plan.takeover`; a kind read fresh instead of
        watched, the cache claim, is judged from that read)."""
        verbs = {"create", "patch"}
        if self.watched:
            verbs |= {"list", "watch"}
        elif self.listed or not self.read:
            verbs.add("list")
        if self.optional or self.workload:
            verbs.add("delete")
        if self.read:
            verbs.add("get")
        return frozenset(verbs)


SERVICE = ChildKind("v1", "Service", "services")
CONFIG_MAP = ChildKind("v1", "ConfigMap", "configmaps", optional=True, name_suffix="-adapters")
"""The desired LoRA adapters (`<name>-adapters`), mounted by the engine pods while LoRA is on:
applied before the workload, so a pod never waits for its mount; deleted when LoRA turns off."""
DEPLOYMENT = ChildKind(
    contract.WORKLOAD_API_VERSIONS[contract.DEPLOYMENTS],
    "Deployment",
    contract.DEPLOYMENTS,
    read=True,
    workload=True,
)
PRE_PULL = ChildKind(
    "apps/v1", "DaemonSet", "daemonsets", optional=True, name_suffix=names.PRE_PULL_SUFFIX
)
"""spec.scheduling.prePullImage: one idle pod of the engine image per node the engine pods may
run on (`llmop.render.pre_pull`); applied before the workload, so its pulls start first."""
PDB = ChildKind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", optional=True)
HPA = ChildKind(
    "autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", optional=True
)
SERVICE_MONITOR = ChildKind(
    "monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors", watched=False
)
INFERENCE_POOL = ChildKind(
    "inference.networking.k8s.io/v1",
    "InferencePool",
    "inferencepools",
    watched=False,
    optional=True,
)
"""spec.router.inferencePool: never watched (the Gateway API Inference Extension CRD may be
absent, and kopf warns forever about a watched kind nobody serves); the parent path knows it
exists from status.inferencePool, which is what makes removing the field delete it."""
NETWORK_POLICY = ChildKind(
    "networking.k8s.io/v1", "NetworkPolicy", "networkpolicies", watched=False
)
"""The engine pods' ingress fence (`llmop.render.network_policy`), with the operator-wide
setting LLMOP_NETWORK_POLICY. Not watched, like the ServiceMonitor: applied with every
reconcile, removed with its CR (garbage collection); turning the setting off leaves the existing
ones in place (docs/operations.md says how to remove them)."""

LEADER_WORKER_SET = ChildKind(
    contract.WORKLOAD_API_VERSIONS[contract.LEADER_WORKER_SETS],
    "LeaderWorkerSet",
    contract.LEADER_WORKER_SETS,
    watched=False,
    listed=True,
    workload=True,
)
"""The workload of a multi-node replica (spec.engine.pipelineParallelSize > 1) instead of the
Deployment. Not watched (the LWS CRD may be absent, and a kopf index of an unserved kind would
hold every handler back): `llmop.group_check` lists them while the cluster serves the API."""
WORKLOADS: tuple[ChildKind, ...] = (DEPLOYMENT, LEADER_WORKER_SET)
"""The two workload kinds; a spec wants exactly one."""


def workload_of_resource(resource: str) -> ChildKind:
    """The workload kind of a resource name (`llmop_router.contract.workload_resource`)."""
    return next(kind for kind in WORKLOADS if kind.plural == resource)


PVC = ChildKind("v1", "PersistentVolumeClaim", "persistentvolumeclaims", watched=False, read=True)
"""The model cache claim (spec.model.cache): applied when the operator creates it, read for the
capacity of an existing one."""
JOB = ChildKind("batch/v1", "Job", "jobs", read=True)
"""The model download Job: watched, so its completion starts the engine pods at once."""

CHILDREN: tuple[ChildKind, ...] = (
    SERVICE,
    CONFIG_MAP,
    PRE_PULL,
    DEPLOYMENT,
    LEADER_WORKER_SET,
    PDB,
    HPA,
    SERVICE_MONITOR,
    INFERENCE_POOL,
    NETWORK_POLICY,
)
"""Every child kind, in apply order (an HPA after its target workload)."""
WATCHED: tuple[ChildKind, ...] = tuple(kind for kind in CHILDREN if kind.watched)
"""Child kinds the operator watches."""


@dataclass(frozen=True)
class ObservedKind(Kind):
    """A kind the operator watches but does not own."""

    patched: bool = False
    """Merge-patched in place (the engine pods' deletion-cost and adapters-revision
    annotations)."""

    def verbs(self) -> frozenset[str]:
        """The RBAC verbs this use needs."""
        return frozenset({"list", "watch", "patch"} if self.patched else {"list", "watch"})


LLMDEPLOYMENT = Kind(API_VERSION, KIND, PLURAL)
EVENT = Kind("v1", "Event", "events")
POD = ObservedKind("v1", "Pod", "pods", patched=True)
NAMESPACE = Kind("v1", "Namespace", "namespaces")

MODEL_CACHE: tuple[ChildKind, ...] = (PVC, JOB)
"""Children of the model cache, applied by the pre-flight gate before the engine children (not
part of `CHILDREN`, whose plan only runs once the cache is filled)."""
SECRET = Kind("v1", "Secret", "secrets")
"""Read only: the token of spec.model.tokenSecretRef, for the pre-flight access check."""
LEASE = Kind("coordination.k8s.io/v1", "Lease", "leases")
"""The leader election's Lease (`llmop.leader`), in the operator's own namespace."""

OBSERVED: tuple[ObservedKind, ...] = (POD,)
"""Kinds the operator watches but does not own (label-filtered, list + watch): the engine pods,
whose problems the status names and whose deletion cost `llmop.fleet` keeps current."""

_BY_KIND = {
    k.kind: k
    for k in (*CHILDREN, *MODEL_CACHE, LLMDEPLOYMENT, EVENT, POD, NAMESPACE, SECRET, LEASE)
}


def child(kind: str) -> ChildKind | None:
    """The child kind named `kind`, if it is one."""
    found = _BY_KIND.get(kind)
    return found if isinstance(found, ChildKind) else None


def plural(kind: str) -> str:
    """The resource name of `kind` (no discovery round trip); unknown kinds guess `kinds`."""
    found = _BY_KIND.get(kind)
    return found.plural if found is not None else kind.lower() + "s"
