"""Leader election: one `llmop run` of several reconciles, through a `coordination.k8s.io/v1`
Lease with client-go's semantics (kopf's peering is not leader election: peers of equal
priority both run, and a dead peer is noticed only after 60 s).

- A candidate takes the Lease when it is free, released, or expired: its holder has not renewed
  it for `lease_duration` as measured on the candidate's own monotonic clock since the record
  last changed (client-go's observed time, so clock skew between nodes does not matter).
- The leader renews it every `retry_period`; when no renewal succeeded for `renew_deadline`
  (shorter than the lease), it has lost it and must stop reconciling before the lease runs out
  and a standby may start: `keep` calls `on_lost` then (`llmop.main` ends the leadership term
  and the same elector campaigns again: a Lease nobody took meanwhile is its own at once).
- A leader that stops cleanly releases the Lease (empty holder, 1 s duration), so a rolling
  update hands over in one retry period instead of a whole lease.

Each attempt is one GET and at most one create or PUT (with the resourceVersion read: of two
candidates that both saw an expired lease, the API server lets exactly one write it).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from llmop import kinds
from llmop.config import OperatorConfig
from llmop.kube import Kube, KubeError

log = logging.getLogger("llmop.leader")

LEASE_NAME = "llmop-operator"
CONFLICT = 409


def lease_namespace(config: OperatorConfig, env: Mapping[str, str]) -> str:
    """The operator's own namespace (the pod's), else the first watched one, else `default`."""
    return env.get("POD_NAMESPACE") or next(iter(config.namespaces), "") or "default"


@dataclass(frozen=True)
class Timing:
    """client-go's defaults (leaderelection.LeaderElectionConfig)."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


def _micro_time(moment: datetime) -> str:
    """A MicroTime as the API server writes it."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_object(
    namespace: str,
    identity: str,
    previous: Mapping[str, Any] | None,
    now: datetime,
    timing: Timing,
    *,
    name: str = LEASE_NAME,
    release: bool = False,
) -> dict[str, Any]:
    """The Lease to write: taken or renewed by `identity` (or released), over `previous`."""
    old = dict((previous or {}).get("spec") or {})
    taking = old.get("holderIdentity") != identity
    transitions = int(old.get("leaseTransitions") or 0)
    if taking and old.get("holderIdentity"):
        transitions += 1
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    version = ((previous or {}).get("metadata") or {}).get("resourceVersion")
    if version:
        metadata["resourceVersion"] = version
    stamp = _micro_time(now)
    return {
        "apiVersion": kinds.LEASE.api_version,
        "kind": kinds.LEASE.kind,
        "metadata": metadata,
        "spec": {
            "holderIdentity": "" if release else identity,
            "leaseDurationSeconds": 1 if release else round(timing.lease_duration),
            "acquireTime": stamp if taking or release else old.get("acquireTime", stamp),
            "renewTime": stamp,
            "leaseTransitions": transitions,
        },
    }


class LeaderElector:
    """Takes and keeps the Lease for `identity`; thread-safe for one acquiring or keeping
    thread plus `release`."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        identity: str,
        *,
        name: str = LEASE_NAME,
        timing: Timing = Timing(),
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.identity = identity
        self.name = name
        self.timing = timing
        self._monotonic = monotonic
        self._wall = wall
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None
        self.holder: str = ""
        """The holder as last read (for logs)."""

    @property
    def leading(self) -> bool:
        return self._renewed_at is not None

    def try_once(self) -> bool:
        """One attempt to take or renew the Lease; True when this process holds it after."""
        lease = self.kube.read(kinds.LEASE.api_version, kinds.LEASE.kind, self.namespace, self.name)
        now = self._monotonic()
        if lease is None:
            return self._write(None, now)
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("acquireTime"))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        self.holder = str(spec.get("holderIdentity") or "")
        duration = float(spec.get("leaseDurationSeconds") or self.timing.lease_duration)
        if self.holder not in ("", self.identity) and now < self._observed_at + duration:
            self._renewed_at = None
            return False
        return self._write(lease, now)

    def _write(self, lease: Mapping[str, Any] | None, now: float) -> bool:
        body = lease_object(
            self.namespace, self.identity, lease, self._wall(), self.timing, name=self.name
        )
        try:
            if lease is None:
                self.kube.create(body)
            else:
                self.kube.replace(body)
        except KubeError as error:
            if error.status != CONFLICT:
                raise
            return False  # another candidate wrote first: read again next time
        if not self.leading:
            log.info("took the leader Lease %s/%s as %s", self.namespace, self.name, self.identity)
        self._renewed_at = now
        self.holder = self.identity
        return True

    def _attempt(self) -> bool:
        try:
            return self.try_once()
        except KubeError as error:
            log.warning("leader Lease %s/%s: %s", self.namespace, self.name, error)
            return False

    def acquire(self, stop: threading.Event) -> bool:
        """Try every retry period (with client-go's jitter) until this process leads; False
        when `stop` was set first."""
        announced = ""
        while not stop.is_set():
            if self._attempt():
                return True
            if self.holder and self.holder != announced:
                log.info("standby: the leader is %s", self.holder)
                announced = self.holder
            stop.wait(self.timing.retry_period * (1 + random.random() * 1.2))
        return False

    def keep(self, stop: threading.Event, on_lost: Callable[[], None]) -> None:
        """Renew every retry period until `stop`; call `on_lost` (once) when another process
        holds the Lease or no renewal succeeded within the renew deadline."""
        while not stop.wait(self.timing.retry_period):
            if self._attempt():
                continue
            renewed = self._renewed_at
            if renewed is None or self._monotonic() - renewed >= self.timing.renew_deadline:
                self._renewed_at = None
                log.error(
                    "lost the leader Lease %s/%s (holder now %r): stopping",
                    self.namespace,
                    self.name,
                    self.holder,
                )
                on_lost()
                return

    def release(self) -> None:
        """Give the Lease up if this process holds it (a clean stop), so a standby takes over
        at its next attempt."""
        if not self.leading:
            return
        self._renewed_at = None
        try:
            lease = self.kube.read(
                kinds.LEASE.api_version, kinds.LEASE.kind, self.namespace, self.name
            )
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            self.kube.replace(
                lease_object(
                    self.namespace,
                    self.identity,
                    lease,
                    self._wall(),
                    self.timing,
                    name=self.name,
                    release=True,
                )
            )
            log.info("released the leader Lease %s/%s", self.namespace, self.name)
        except KubeError as error:
            log.warning("could not release the leader Lease: %s", error)
