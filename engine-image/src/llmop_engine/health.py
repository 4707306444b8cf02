"""Pure progress/phase state machine: observations in, liveness and readiness verdicts out.

No I/O and no clock: every function takes `now` (monotonic seconds), so the rules of DESIGN.md §7
are table-tested without processes. The agent feeds it one `Observation` per poll and one
`ProbeResult` per deep probe.

Rules, in order:
- the engine process exited → failed (not live);
- draining → not ready, still live (the kubelet must not restart a pod that is finishing work);
- never listened yet → downloading while the model cache grows, else loading within the load budget
  (alive, not ready); past the budget → not live;
- `/health` says dead (503), or a deep probe is answered with vLLM's EngineDeadError → not live,
  for good: vLLM never recovers from EngineDeadError, and the
  port closing afterwards must not read as "restarting"; unreachable after having served → not
  ready at once (connection refused) or after the probe timeout (hanging HTTP), not live after
  `stallSeconds`;
- pending work (waiting + running > 0): progress means the generated/prefilled token counter grew.
  No progress for `stallSeconds` → hung (not live, not ready); for the shorter readiness window
  (min(stall, deep-probe interval)) → not ready. Otherwise ready however slow requests are;
- idle: ready iff the last one-token deep probe passed; failing probes with no progress for
  `stallSeconds` → not live;
- no load figures (vLLM with `--disable-log-stats` exports no `vllm:*` series): busy and idle look
  alike, so a deep probe that *timed out* may only have queued behind real work. It costs
  readiness after `stallSeconds` of timeouts, never liveness; probes that fail with an answer
  (HTTP 5xx, aborted, a dropped connection) count as usual, from the last timeout on.

The load the agent publishes (queue depth, running, KV usage) is `published_load`: the last
scrape only while the latest poll read one and it is recent (a poll stuck on a hung engine
counts as no reading), never an old figure from an engine that stopped answering (the autoscaler
would act on it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from llmop_engine import contract
from llmop_engine.vllm_metrics import EngineMetrics


class Phase(enum.StrEnum):
    STARTING = "starting"
    DOWNLOADING = "downloading"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"


class Reach(enum.StrEnum):
    """What one poll of the engine's `/health` found."""

    OK = "ok"  # 200
    DEAD = "dead"  # 503: vLLM's EngineDeadError
    REFUSED = "refused"  # connection refused: not listening (loading, or gone)
    ERROR = "error"  # timeout or any other failure


Policy = contract.AgentSettings
"""The rules' thresholds are the agent's settings (stall, load budget, deep probe): one table,
so the policy's defaults are the agent's and the CRD's."""


def ready_stall_seconds(policy: Policy) -> float:
    """Busy without progress for this long → stop routing new work here (before liveness)."""
    return min(policy.stall_seconds, policy.deep_probe_interval_seconds)


@dataclass(frozen=True)
class Observation:
    now: float
    process_alive: bool
    reach: Reach
    metrics: EngineMetrics | None = None
    cache_bytes: int | None = None
    exit_code: int | None = None
    # False: /metrics did not answer (timeout, error); that says nothing about whether the
    # engine exports load figures, unlike an answer without vllm:* series.
    metrics_answered: bool = True


@dataclass(frozen=True)
class ProbeResult:
    started_at: float
    finished_at: float
    ok: bool
    error: str = ""
    # No answer within the timeout (as opposed to an answer saying it failed).
    timed_out: bool = False
    # The answer said the engine is dead (vLLM's EngineDeadError): as final as /health 503.
    engine_dead: bool = False

    @property
    def latency(self) -> float:
        return self.finished_at - self.started_at


@dataclass(frozen=True)
class HealthState:
    started_at: float
    observed: bool = False
    exit_code: int | None = None
    process_alive: bool = True
    draining: bool = False
    drain_started_at: float | None = None
    reach: Reach = Reach.REFUSED
    listening_since: float | None = None
    last_reach_ok_at: float | None = None
    # Polls in a row whose /health got no answer (or not 200); 0 after one that got 200.
    reach_failures: int = 0
    cache_bytes: int | None = None
    last_download_progress_at: float | None = None
    metrics: EngineMetrics | None = None
    # The latest poll read the engine's load figures (not just an older scrape kept for judging).
    load_fresh: bool = False
    metrics_at: float | None = None
    # The engine answered /health but exported no vLLM metrics (e.g. --disable-log-stats).
    metrics_missing: bool = False
    # First /health 503 (EngineDeadError): sticky, the engine does not come back from it.
    dead_at: float | None = None
    # The agent sent the drain's final SIGTERM: the engine now tears itself down (vLLM answers
    # /health 503 while it does), which is the stop the agent asked for, not a failure.
    stopping: bool = False
    busy_since: float | None = None
    last_progress_value: float | None = None
    last_progress_at: float | None = None
    last_probe: ProbeResult | None = None
    last_probe_ok_at: float | None = None
    # The latest probe that got no answer in time: without load figures it proves nothing (it may
    # have queued behind real work), so a run of failures is counted from after it.
    last_probe_timeout_at: float | None = None
    probe_in_flight: bool = False


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The agent's judgement at one instant. `phase` is the engine's lifecycle stage; `live`
    and `ready` are the probe answers. They differ on purpose: a serving engine (phase `ready`)
    whose deep probe just failed is not ready. Keyword-only, so no call reads as ready while
    it is not."""

    phase: Phase
    live: bool
    ready: bool
    reason: str


UNANSWERED_POLLS_BEFORE_UNREADY = 2
"""/health polls in a row that must go unanswered before readiness goes off (a refused
connection takes it off at once: nothing listens)."""


def initial(now: float) -> HealthState:
    return HealthState(started_at=now)


def observe(state: HealthState, obs: Observation) -> HealthState:
    """Fold one poll into the state."""
    now = obs.now
    new = replace(
        state,
        observed=True,
        process_alive=obs.process_alive,
        reach=obs.reach,
        load_fresh=obs.reach is Reach.OK and obs.metrics is not None,
        reach_failures=0 if obs.reach is Reach.OK else state.reach_failures + 1,
    )
    if obs.reach is Reach.DEAD and state.dead_at is None and not state.stopping:
        new = replace(new, dead_at=now)
    if obs.exit_code is not None:
        new = replace(new, exit_code=obs.exit_code, process_alive=False)
    if obs.cache_bytes is not None:
        if state.cache_bytes is not None and obs.cache_bytes > state.cache_bytes:
            new = replace(new, last_download_progress_at=now)
        new = replace(new, cache_bytes=obs.cache_bytes)
    if obs.reach is Reach.OK:
        new = replace(
            new,
            last_reach_ok_at=now,
            listening_since=state.listening_since if state.listening_since is not None else now,
        )
    if obs.reach is Reach.OK and obs.metrics_answered:
        new = replace(new, metrics_missing=obs.metrics is None)
        if obs.metrics is not None:
            new = _fold_metrics(new, obs.metrics, now)
    return new


def published_load(state: HealthState, now: float, max_age: float) -> EngineMetrics | None:
    """The load figures to export: those the latest poll read, if at most `max_age` old; else
    none (unknown)."""
    if not state.load_fresh or state.metrics_at is None or now - state.metrics_at > max_age:
        return None
    return state.metrics


def _fold_metrics(state: HealthState, metrics: EngineMetrics, now: float) -> HealthState:
    progress = metrics.progress_tokens
    last_value, last_at = state.last_progress_value, state.last_progress_at
    if progress is not None:
        if last_value is not None and progress > last_value:
            last_at = now
        # A counter reset (engine restarted in place) is a new baseline, not progress.
        last_value = progress
    pending = metrics.pending
    busy_since = state.busy_since
    if pending is not None and pending > 0:
        busy_since = busy_since if busy_since is not None else now
    else:
        busy_since = None
    return replace(
        state,
        metrics=metrics,
        metrics_at=now,
        busy_since=busy_since,
        last_progress_value=last_value,
        last_progress_at=last_at,
    )


def probe_started(state: HealthState) -> HealthState:
    return replace(state, probe_in_flight=True)


def record_probe(state: HealthState, result: ProbeResult) -> HealthState:
    dead_at = state.dead_at
    if result.engine_dead and dead_at is None and not state.stopping:
        # A crash can close the port before any poll sees /health 503: the probe saw it.
        dead_at = result.finished_at
    return replace(
        state,
        probe_in_flight=False,
        last_probe=result,
        last_probe_ok_at=result.finished_at if result.ok else state.last_probe_ok_at,
        last_probe_timeout_at=result.finished_at
        if result.timed_out
        else state.last_probe_timeout_at,
        dead_at=dead_at,
    )


def start_drain(state: HealthState, now: float) -> HealthState:
    if state.draining:
        return state
    return replace(state, draining=True, drain_started_at=now)


def stop_sent(state: HealthState) -> HealthState:
    """The drain's final SIGTERM went to the engine: from now on its death is expected."""
    return replace(state, stopping=True)


def is_busy(state: HealthState) -> bool:
    pending = state.metrics.pending if state.metrics is not None else None
    return pending is not None and pending > 0


def load_known(state: HealthState) -> bool:
    """The engine exports its queue and progress counters (vLLM without --disable-log-stats)."""
    return not state.metrics_missing and state.metrics is not None


def deep_probe_due(state: HealthState, policy: Policy, now: float) -> bool:
    """A one-token probe is due: enabled, serving, idle, none in flight, interval elapsed."""
    if not policy.deep_probe_enabled or state.draining or state.exit_code is not None:
        return False
    if state.reach is not Reach.OK or state.probe_in_flight:
        return False
    # Busy: progress counters decide; a probe would only queue behind real work.
    if is_busy(state):
        return False
    if state.last_probe is None:
        return True
    return now - state.last_probe.started_at >= policy.deep_probe_interval_seconds


def next_probe_at(state: HealthState, policy: Policy) -> float | None:
    if state.last_probe is None:
        return None
    return state.last_probe.started_at + policy.deep_probe_interval_seconds


def _latest(*times: float | None) -> float | None:
    present = [t for t in times if t is not None]
    return max(present) if present else None


def verdict(state: HealthState, policy: Policy, now: float) -> Verdict:
    """Liveness and readiness for `now`."""
    if state.exit_code is not None or not state.process_alive:
        code = "unknown" if state.exit_code is None else str(state.exit_code)
        return Verdict(
            phase=Phase.FAILED,
            live=False,
            ready=False,
            reason=f"engine process exited (code {code})",
        )
    if state.dead_at is not None:
        # Sticky: after EngineDeadError vLLM only exits; a closing port is not a recovery.
        return Verdict(
            phase=Phase.FAILED, live=False, ready=False, reason="engine /health reported dead (503)"
        )
    if state.draining:
        return Verdict(phase=Phase.DRAINING, live=True, ready=False, reason="draining")
    if not state.observed:
        return Verdict(
            phase=Phase.STARTING, live=True, ready=False, reason="engine process starting"
        )
    if state.listening_since is None:
        return _starting_verdict(state, policy, now)
    return _serving_verdict(state, policy, now)


def _starting_verdict(state: HealthState, policy: Policy, now: float) -> Verdict:
    dl = state.last_download_progress_at
    if dl is not None and now - dl <= policy.stall_seconds:
        return Verdict(
            phase=Phase.DOWNLOADING, live=True, ready=False, reason="model download in progress"
        )
    load_start = _latest(state.started_at, dl) or state.started_at
    elapsed = now - load_start
    if elapsed > policy.load_timeout_seconds:
        return Verdict(
            phase=Phase.FAILED,
            live=False,
            ready=False,
            reason=f"engine not listening {elapsed:.0f}s after start (load budget "
            f"{policy.load_timeout_seconds:.0f}s)",
        )
    return Verdict(
        phase=Phase.LOADING,
        live=True,
        ready=False,
        reason=f"engine loading (port not listening, {elapsed:.0f}s)",
    )


def _serving_verdict(state: HealthState, policy: Policy, now: float) -> Verdict:
    if state.reach is not Reach.OK:
        since = now - (state.last_reach_ok_at or now)
        unanswered = state.reach_failures >= UNANSWERED_POLLS_BEFORE_UNREADY
        # One unanswered poll never costs liveness: when this process itself was held
        # up (17 s once on a loaded node, measured), the /health call in flight times out the
        # moment it runs again, and `since` spans the whole hold-up.
        if since > policy.stall_seconds and (unanswered or state.reach is Reach.REFUSED):
            return Verdict(
                phase=Phase.FAILED,
                live=False,
                ready=False,
                reason=f"engine unreachable for {since:.0f}s",
            )
        # One /health poll that got no answer is not enough to pull the pod out: vLLM's API
        # server, streaming for every client on one event loop, answers it late now and then,
        # and a loaded node can hold up this process for seconds (measured on real vLLM: 0.2-5 s
        # readiness dips of a busy engine that kept generating). A timed-out poll lasts the
        # whole timeout, so `since` alone passed the bound after a single one.
        if state.reach is Reach.REFUSED or (
            unanswered and since > policy.deep_probe_timeout_seconds
        ):
            return Verdict(
                phase=Phase.READY,
                live=True,
                ready=False,
                reason=f"engine not answering ({state.reach})",
            )
        # Until then, judge by what the last answered poll showed.
    if is_busy(state):
        return _busy_verdict(state, policy, now)
    return _idle_verdict(state, policy, now)


def _busy_verdict(state: HealthState, policy: Policy, now: float) -> Verdict:
    metrics = state.metrics
    assert metrics is not None
    pending = int(metrics.pending or 0)
    ref = _latest(state.busy_since, state.last_progress_at) or now
    stalled = now - ref
    # Readiness judges a stall as of the last load reading: a poll that came late (this process
    # held up) or a /metrics read that timed out is no evidence that the engine stopped. The
    # hang rule (liveness) still counts to now.
    seen_stalled = (state.metrics_at if state.metrics_at is not None else now) - ref
    if stalled > policy.stall_seconds:
        return Verdict(
            phase=Phase.FAILED,
            live=False,
            ready=False,
            reason=f"hung: {pending} pending requests and no generated tokens for {stalled:.0f}s",
        )
    if seen_stalled > ready_stall_seconds(policy):
        return Verdict(
            phase=Phase.READY,
            live=True,
            ready=False,
            reason=f"no progress for {seen_stalled:.0f}s with {pending} pending",
        )
    probe = state.last_probe
    # A probe that timed out while the engine is busy queued behind real work (it was sent
    # from an idle reading just as load arrived): the progress counters above decide. An
    # answered failure (an error) still counts until progress is seen after it.
    if probe is not None and not probe.ok and not probe.timed_out:
        progressed_after = (
            state.last_progress_at is not None and state.last_progress_at > probe.finished_at
        )
        if not progressed_after:
            return Verdict(
                phase=Phase.READY,
                live=True,
                ready=False,
                reason=f"deep probe failed: {probe.error}",
            )
    return Verdict(
        phase=Phase.READY,
        live=True,
        ready=True,
        reason=f"busy, making progress ({pending} pending)",
    )


def _idle_verdict(state: HealthState, policy: Policy, now: float) -> Verdict:
    if not policy.deep_probe_enabled:
        return Verdict(
            phase=Phase.READY, live=True, ready=True, reason="serving (deep probe disabled)"
        )
    probe = state.last_probe
    if probe is None:
        return Verdict(
            phase=Phase.LOADING,
            live=True,
            ready=False,
            reason="listening; waiting for the first deep probe",
        )
    if probe.ok:
        return Verdict(
            phase=Phase.READY,
            live=True,
            ready=True,
            reason=f"deep probe ok ({probe.latency * 1000:.0f} ms)",
        )
    good = _latest(state.last_probe_ok_at, state.last_progress_at, state.listening_since) or now
    failing = now - good
    progressed = state.last_progress_at is not None and state.last_progress_at >= probe.started_at
    if probe.timed_out and progressed:
        # Tokens were generated while it waited: it queued behind work that has ended since
        # (sent from an idle reading just as load arrived). The next probe decides.
        return Verdict(
            phase=Phase.READY,
            live=True,
            ready=True,
            reason=f"deep probe {probe.error} behind work that made progress",
        )
    # No load reading answered since it was sent (vLLM's API server, streaming for every client,
    # leaves /metrics unanswered under load): idle is an old reading, and a probe stuck behind
    # real work looks like a hang. Routable until the stall bound, then judged as any failure.
    unread = load_known(state) and (state.metrics_at or 0.0) < probe.started_at
    if probe.timed_out and unread and failing <= policy.stall_seconds:
        return Verdict(
            phase=Phase.READY,
            live=True,
            ready=True,
            reason=f"deep probe {probe.error}; no load reading since it was sent",
        )
    if probe.timed_out and not load_known(state):
        # Without load figures a probe stuck behind real work looks exactly like a hang; killing
        # a saturated engine is the worse mistake, so timeouts alone never cost liveness.
        if failing > policy.stall_seconds:
            return Verdict(
                phase=Phase.READY,
                live=True,
                ready=False,
                reason=(
                    f"deep probe timing out for {failing:.0f}s and the engine exports no "
                    "metrics (--disable-log-stats?): busy or hung cannot be told apart"
                ),
            )
        return Verdict(
            phase=Phase.READY,
            live=True,
            ready=True,
            reason=f"deep probe {probe.error}; engine busy? (no metrics)",
        )
    if not load_known(state):
        # A failure with an answer after timeouts: those timeouts were no evidence of a hang, so
        # the failing streak starts now (one dropped connection must not kill a saturated engine).
        failing = now - (_latest(good, state.last_probe_timeout_at) or now)
    if failing > policy.stall_seconds:
        return Verdict(
            phase=Phase.FAILED,
            live=False,
            ready=False,
            reason=f"deep probe failing for {failing:.0f}s: {probe.error}",
        )
    return Verdict(
        phase=Phase.READY, live=True, ready=False, reason=f"deep probe failed: {probe.error}"
    )
