"""Orchestration: say when the LLMDeployment CRD is missing, and when it appears.

A leader started on a cluster without the CustomResourceDefinition serves nothing until it is
installed (kopf serves it by itself once it exists: `llmop.late_crds`). One thread (a row of
`llmop.runnables`) checks once at the start of each term; with the CRD missing it says which
one and how to install it (an error in the log, and a Warning Event on the operator's pod or
Lease), then looks for it every `CHECK_SECONDS` and says when it appears. A thread, so a
missing CRD never keeps the process from running (or Ready).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from llmop import events, kinds
from llmop.config import OperatorConfig
from llmop.kube import Kube, KubeError
from llmop.leader import LEASE_NAME, lease_namespace
from llmop.periodic import DONE, run_in_thread
from llmop.reconcile import Context

log = logging.getLogger("llmop.main")

CHECK_SECONDS = 5.0
"""How often a leader started without the CRD looks for it (kopf serves it by itself once it
exists; this only says so)."""
CRD_NAME = f"{kinds.LLMDEPLOYMENT.plural}.{kinds.LLMDEPLOYMENT.group}"
MISSING_CRD = (
    f"the CustomResourceDefinition {CRD_NAME} is not installed, so no LLMDeployment can be "
    "served: install it with the chart (helm upgrade <release> helm/llmop --set crds.enabled=true) "
    "or `kubectl apply --server-side -f crds/` from the llmop release; reconciling starts as "
    "soon as it exists"
)


def operator_object(kube: Kube, config: OperatorConfig) -> dict[str, Any] | None:
    """What an operator-level Event is about: this process's pod, as the downward API names it
    (POD_NAME, POD_UID: the operator may not read pods by name), else its leader Lease."""
    namespace = lease_namespace(config, dict(os.environ))
    pod, uid = os.environ.get("POD_NAME"), os.environ.get("POD_UID")
    if pod and uid:
        metadata = {"name": pod, "namespace": namespace, "uid": uid}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata}
    if config.leader_elect:
        return kube.read(kinds.LEASE.api_version, kinds.LEASE.kind, namespace, LEASE_NAME)
    return None


def _served(kube: Kube) -> bool:
    return kube.serves(kinds.LLMDEPLOYMENT.api_version, kinds.LLMDEPLOYMENT.plural)


def _missing(context: Context) -> bool:
    """Whether the CRD is missing (then said, with a Warning Event); False when it is served or
    the check failed."""
    kube = context.kube
    try:
        if _served(kube):
            return False
    except KubeError as error:
        log.warning("could not check for the CRD %s: %s", CRD_NAME, error)
        return False
    log.error(MISSING_CRD)
    try:
        involved = operator_object(kube, context.config)
        if involved is not None:
            spec = events.EventSpec("Warning", "CRDMissing", MISSING_CRD)
            kube.create_event(
                events.render_event(involved, spec, now=context.clock(), instance=context.instance)
            )
    except KubeError as error:  # with watchNamespaces, its own namespace may not be granted
        log.warning("could not post the CRDMissing Event: %s", error)
    return True


def _appeared(kube: Kube) -> object:
    if not _served(kube):
        return None
    log.info("the CustomResourceDefinition %s is installed: reconciling", CRD_NAME)
    return DONE


def run(context: Context, stop: threading.Event, *, interval: float = CHECK_SECONDS) -> None:
    """Check now; with the CRD missing, look for it every `interval` seconds until it is
    installed or `stop` is set."""
    if not _missing(context):
        return
    run_in_thread(
        interval,
        lambda: _appeared(context.kube),
        stop,
        log=log,
        failure=f"could not check for the CRD {CRD_NAME}",
        expected=(KubeError,),
        first_wait=interval,
    )
