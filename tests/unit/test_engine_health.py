"""Table-driven tests of the agent's pure progress/phase state machine."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from llmop_engine import health
from llmop_engine.health import Observation, Phase, Policy, ProbeResult, Reach
from llmop_engine.vllm_metrics import EngineMetrics

POLICY = Policy(
    stall_seconds=30,
    load_timeout_seconds=100,
    deep_probe_enabled=True,
    deep_probe_interval_seconds=10,
    deep_probe_timeout_seconds=5,
)


def busy(gen: float, waiting: float = 2, running: float = 4) -> EngineMetrics:
    return EngineMetrics(waiting=waiting, running=running, generation_tokens=gen, prompt_tokens=0)


def idle(gen: float = 0) -> EngineMetrics:
    return EngineMetrics(waiting=0, running=0, generation_tokens=gen, prompt_tokens=0)


@dataclass(frozen=True)
class Step:
    """One event at time t: an observation, or a probe result when `probe` is set."""

    t: float
    reach: Reach = Reach.OK
    metrics: EngineMetrics | None = None
    alive: bool = True
    exit_code: int | None = None
    cache_bytes: int | None = None
    probe: bool | None = None  # True/False: a deep probe that finished at t with this result
    timeout: bool = False  # the failed probe got no answer (rather than an error answer)
    drain: bool = False
    answered: bool = True  # False: /metrics did not answer (timeout), `metrics` is then None
    probe_from: float | None = None  # when the probe finishing at t was sent (else t - 0.05)


@dataclass(frozen=True)
class Case:
    name: str
    steps: list[Step]
    at: float
    phase: Phase
    live: bool
    ready: bool
    policy: Policy = field(default=POLICY)


def run(case: Case) -> health.Verdict:
    state = health.initial(0.0)
    for s in case.steps:
        if s.drain:
            state = health.start_drain(state, s.t)
        elif s.probe is not None:
            state = health.probe_started(state)
            error = "" if s.probe else ("timed out" if s.timeout else "HTTP 500")
            state = health.record_probe(
                state,
                ProbeResult(
                    s.t - 0.05 if s.probe_from is None else s.probe_from,
                    s.t,
                    s.probe,
                    error,
                    timed_out=s.timeout,
                ),
            )
        else:
            state = health.observe(
                state,
                Observation(
                    s.t,
                    s.alive,
                    s.reach,
                    s.metrics,
                    s.cache_bytes,
                    s.exit_code,
                    metrics_answered=s.answered,
                ),
            )
    return health.verdict(state, case.policy, case.at)


SERVING = [Step(1, Reach.OK, idle()), Step(1.1, probe=True)]

CASES = [
    Case("nothing observed yet", [], 0.5, Phase.STARTING, live=True, ready=False),
    Case("loading: port refused within budget", [Step(5, Reach.REFUSED)], 50,
         Phase.LOADING, live=True, ready=False),
    Case("loading past the budget", [Step(5, Reach.REFUSED), Step(101, Reach.REFUSED)], 101,
         Phase.FAILED, live=False, ready=False),
    Case("downloading: cache grows, budget restarts from last growth",
         [Step(1, Reach.REFUSED, cache_bytes=10), Step(90, Reach.REFUSED, cache_bytes=500)], 110,
         Phase.DOWNLOADING, live=True, ready=False),
    Case("download stalled then loading within budget",
         [Step(1, Reach.REFUSED, cache_bytes=10), Step(90, Reach.REFUSED, cache_bytes=500),
          Step(150, Reach.REFUSED, cache_bytes=500)], 150,
         Phase.LOADING, live=True, ready=False),
    Case("listening, first deep probe pending", [Step(1, Reach.OK, idle())], 1.5,
         Phase.LOADING, live=True, ready=False),
    Case("idle, deep probe ok", SERVING, 2, Phase.READY, live=True, ready=True),
    Case("idle, deep probe failed once", [*SERVING, Step(12, probe=False)], 12,
         Phase.READY, live=True, ready=False),
    Case("idle, deep probes failing for longer than stall",
         [*SERVING, Step(12, probe=False), Step(22, probe=False), Step(32, probe=False)], 32,
         Phase.FAILED, live=False, ready=False),
    Case("deep probe recovers", [*SERVING, Step(12, probe=False), Step(22, probe=True)], 22,
         Phase.READY, live=True, ready=True),
    Case("busy with progress, however slow probes would be",
         [*SERVING, Step(2, metrics=busy(10)), Step(25, metrics=busy(11)),
          Step(50, metrics=busy(12))], 50.5,
         Phase.READY, live=True, ready=True),
    Case("busy, no progress beyond the readiness window",
         [*SERVING, Step(2, metrics=busy(10)), Step(14, metrics=busy(10))], 14,
         Phase.READY, live=True, ready=False),
    Case("busy, a late poll whose /metrics read timed out is no evidence of a stall",
         [*SERVING, Step(2, metrics=busy(10)), Step(3, metrics=busy(11)),
          Step(14, answered=False)], 14,
         Phase.READY, live=True, ready=True),
    Case("busy, /metrics unanswered for a whole stall: hung all the same",
         [*SERVING, Step(2, metrics=busy(10)), Step(3, metrics=busy(11)),
          Step(34, answered=False)], 34,
         Phase.FAILED, live=False, ready=False),
    Case("busy, no progress beyond stall: hung",
         [*SERVING, Step(2, metrics=busy(10)), Step(20, metrics=busy(10)),
          Step(33, metrics=busy(10))], 33,
         Phase.FAILED, live=False, ready=False),
    Case("hung engine that recovers progress is healthy again",
         [*SERVING, Step(2, metrics=busy(10)), Step(33, metrics=busy(10)),
          Step(34, metrics=busy(11))], 34,
         Phase.READY, live=True, ready=True),
    Case("pending work measured from when it appeared, not from old progress",
         [*SERVING, Step(2, metrics=idle(5)), Step(100, metrics=busy(5))], 101,
         Phase.READY, live=True, ready=True),
    Case("failed probe while busy without later progress: not ready",
         [*SERVING, Step(12, probe=False), Step(13, metrics=busy(0))], 13,
         Phase.READY, live=True, ready=False),
    Case("probe timed out as load arrived (queued behind it), busy: progress decides",
         [*SERVING, Step(12, probe=False, timeout=True), Step(13, metrics=busy(0))], 13,
         Phase.READY, live=True, ready=True),
    Case("idle, probe timed out while tokens were generated (behind work now done): ready",
         [*SERVING, Step(8, Reach.OK, idle(50)), Step(9, probe=False, timeout=True, probe_from=6)],
         9, Phase.READY, live=True, ready=True),
    Case("idle reading older than a timed-out probe (/metrics unanswered since): ready",
         [*SERVING, Step(6, answered=False), Step(9, probe=False, timeout=True, probe_from=6)],
         9, Phase.READY, live=True, ready=True),
    Case("idle, fresh readings without progress, probe timed out: not ready (a hang)",
         [*SERVING, Step(6, Reach.OK, idle()), Step(7, Reach.OK, idle()),
          Step(9, probe=False, timeout=True, probe_from=6)],
         9, Phase.READY, live=True, ready=False),
    Case("failed probe superseded by progress",
         [*SERVING, Step(12, probe=False), Step(13, metrics=busy(0)), Step(14, metrics=busy(9))],
         14, Phase.READY, live=True, ready=True),
    Case("engine process exited", [*SERVING, Step(5, alive=False, exit_code=3)], 5,
         Phase.FAILED, live=False, ready=False),
    Case("draining: not ready, still live", [*SERVING, Step(5, drain=True)], 6,
         Phase.DRAINING, live=True, ready=False),
    Case("/health 503: engine dead", [*SERVING, Step(5, Reach.DEAD)], 5,
         Phase.FAILED, live=False, ready=False),
    Case("stopped listening after serving: not ready at once",
         [*SERVING, Step(5, Reach.REFUSED)], 5, Phase.READY, live=True, ready=False),
    Case("unreachable beyond stall", [*SERVING, Step(5, Reach.REFUSED), Step(40, Reach.REFUSED)],
         40, Phase.FAILED, live=False, ready=False),
    Case("one slow /health answer keeps the last verdict", [*SERVING, Step(5, Reach.ERROR)], 5,
         Phase.READY, live=True, ready=True),
    # A timed-out poll lasts the whole timeout: one alone used to pass the bound (real vLLM,
    # busy and generating, dipped out of readiness for 0.2-5 s this way).
    Case("one unanswered /health past the probe timeout, busy and progressing: still ready",
         [Step(1, Reach.OK, busy(0)), Step(2, Reach.OK, busy(50)), Step(8, Reach.ERROR)], 8,
         Phase.READY, live=True, ready=True),
    Case("two unanswered /health in a row past the probe timeout: not ready",
         [*SERVING, Step(4, Reach.ERROR), Step(7.5, Reach.ERROR)], 7.5,
         Phase.READY, live=True, ready=False),
    Case("one unanswered poll after this process was held up past stall: still live",
         [*SERVING, Step(40, Reach.ERROR)], 40, Phase.READY, live=True, ready=True),
    Case("unanswered twice in a row past stall: failed",
         [*SERVING, Step(39, Reach.ERROR), Step(40, Reach.ERROR)], 40,
         Phase.FAILED, live=False, ready=False),
    Case("an answered poll between two unanswered ones starts the count again",
         [*SERVING, Step(4, Reach.ERROR), Step(5, Reach.OK, idle()), Step(11, Reach.ERROR)], 11,
         Phase.READY, live=True, ready=True),
    Case("no vLLM metrics (--disable-log-stats): deep probe decides",
         [Step(1, Reach.OK, None), Step(1.1, probe=True)], 2, Phase.READY, live=True, ready=True),
    Case("dead is sticky: /health 503, then the port closes (bug 5)",
         [*SERVING, Step(5, Reach.DEAD), Step(6, Reach.REFUSED)], 6,
         Phase.FAILED, live=False, ready=False),
    Case("dead is sticky: 503, then /health 200 again",
         [*SERVING, Step(5, Reach.DEAD), Step(6, Reach.OK, idle())], 6,
         Phase.FAILED, live=False, ready=False),
    Case("dead while draining: failed, not draining",
         [*SERVING, Step(5, drain=True), Step(6, Reach.DEAD)], 6,
         Phase.FAILED, live=False, ready=False),
    Case("no metrics, deep probe timing out beyond stall: busy or hung, stays live (bug 4)",
         [Step(1, Reach.OK, None), Step(1.1, probe=True), Step(12, probe=False, timeout=True),
          Step(40, Reach.OK, None), Step(41, probe=False, timeout=True)], 41,
         Phase.READY, live=True, ready=False),
    Case("no metrics, one probe timeout: keeps routing (saturated, not hung)",
         [Step(1, Reach.OK, None), Step(1.1, probe=True), Step(12, probe=False, timeout=True)],
         12, Phase.READY, live=True, ready=True),
    Case("no metrics, timeouts beyond stall then one error answer: still live (saturated)",
         [Step(1, Reach.OK, None), Step(1.1, probe=True), Step(12, probe=False, timeout=True),
          Step(40, Reach.OK, None), Step(41, probe=False, timeout=True), Step(45, probe=False)],
         45, Phase.READY, live=True, ready=False),
    Case("no metrics, errors keep coming stall after the last timeout: failed",
         [Step(1, Reach.OK, None), Step(1.1, probe=True), Step(12, probe=False, timeout=True),
          Step(20, probe=False), Step(50, Reach.OK, None), Step(51, probe=False)],
         51, Phase.FAILED, live=False, ready=False),
    Case("no metrics, probes answered with errors beyond stall: failed",
         [Step(1, Reach.OK, None), Step(1.1, probe=True), Step(12, probe=False),
          Step(40, Reach.OK, None), Step(41, probe=False)], 41,
         Phase.FAILED, live=False, ready=False),
    Case("metrics on and idle, probe timing out beyond stall: hung",
         [*SERVING, Step(12, probe=False, timeout=True), Step(40, metrics=idle()),
          Step(41, probe=False, timeout=True)], 41,
         Phase.FAILED, live=False, ready=False),
    Case("deep probe disabled: serving means ready", [Step(1, Reach.OK, idle())], 2,
         Phase.READY, live=True, ready=True,
         policy=Policy(stall_seconds=30, deep_probe_enabled=False)),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_verdict(case: Case) -> None:
    v = run(case)
    assert (v.phase, v.live, v.ready) == (case.phase, case.live, case.ready), v.reason


def _state_after(steps: list[Step]) -> health.HealthState:
    state = health.initial(0.0)
    for s in steps:
        if s.probe is not None:
            state = health.record_probe(state, ProbeResult(s.t, s.t + 0.02, s.probe))
        else:
            state = health.observe(
                state, Observation(s.t, True, s.reach, s.metrics, metrics_answered=s.answered)
            )
    return state


@pytest.mark.parametrize(
    ("steps", "now", "due"),
    [
        ([Step(1, Reach.REFUSED)], 1, False),  # not listening
        ([Step(1, Reach.OK, idle())], 1, True),  # first probe right away
        ([Step(1, Reach.OK, idle()), Step(1, probe=True)], 10.9, False),  # interval not elapsed
        ([Step(1, Reach.OK, idle()), Step(1, probe=True)], 11.0, True),  # one per interval
        ([Step(1, Reach.OK, idle()), Step(1, probe=True), Step(5, metrics=busy(3))], 30, False),
        ([Step(1, Reach.OK, None), Step(1, probe=True)], 11.0, True),  # no metrics: keep probing
    ],
)
def test_deep_probe_due(steps: list[Step], now: float, due: bool) -> None:
    assert health.deep_probe_due(_state_after(steps), POLICY, now) is due


def test_no_second_probe_while_one_in_flight() -> None:
    state = health.probe_started(_state_after([Step(1, Reach.OK, idle())]))
    assert not health.deep_probe_due(state, POLICY, 100)


def test_no_probe_while_draining() -> None:
    state = health.start_drain(_state_after([Step(1, Reach.OK, idle())]), 2)
    assert not health.deep_probe_due(state, POLICY, 100)


def test_counter_reset_is_a_baseline_not_progress() -> None:
    state = _state_after([Step(1, Reach.OK, busy(100)), Step(2, Reach.OK, busy(5))])
    assert state.last_progress_at is None


def test_published_load_is_only_the_latest_reading() -> None:
    """Bug 7: an engine that stops answering has no current queue; the old one is not exported."""
    state = _state_after([Step(1, Reach.OK, busy(10, waiting=7, running=3))])
    load = health.published_load(state, 2, max_age=3)
    assert load is not None
    assert (load.waiting, load.running) == (7, 3)
    for reach in (Reach.ERROR, Reach.REFUSED, Reach.DEAD):
        stale = health.observe(state, Observation(2, True, reach))
        assert health.published_load(stale, 2, max_age=3) is None, reach
        # ...while the verdict still judges by the last reading (hang detection needs it).
        assert stale.metrics is not None
    no_metrics = health.observe(state, Observation(2, True, Reach.OK, None))
    assert health.published_load(no_metrics, 2, max_age=3) is None
    # A poll stuck on a hung engine has not reported yet: the reading ages out meanwhile.
    assert health.published_load(state, 4.5, max_age=3) is None


def test_death_after_the_agents_final_sigterm_is_the_stop_it_asked_for() -> None:
    """vLLM answers /health 503 while it tears down after SIGTERM: not a failure, not sticky."""
    state = _state_after([Step(1, Reach.OK, idle())])
    state = health.stop_sent(health.start_drain(state, 2))
    state = health.observe(state, Observation(3, True, Reach.DEAD))
    assert state.dead_at is None
    assert health.verdict(state, POLICY, 3).phase is Phase.DRAINING


def test_a_probe_answered_with_engine_dead_is_final() -> None:
    """A crash closed vLLM's port before any poll saw /health 503; the deep probe got the
    EngineDeadError (HTTP 500). The closed port after it must not read as alive again."""
    state = _state_after([Step(1, Reach.OK, idle()), Step(1.1, probe=True)])
    state = health.record_probe(
        state, ProbeResult(5, 5.1, False, "HTTP 500: EngineCore encountered", engine_dead=True)
    )
    state = health.observe(state, Observation(6, True, Reach.REFUSED))
    v = health.verdict(state, POLICY, 6)
    assert (v.phase, v.live) == (Phase.FAILED, False)


def test_an_unanswered_metrics_read_is_not_missing_metrics() -> None:
    """A /metrics timeout (a saturated vLLM API server) is not --disable-log-stats: the load
    stays known, and the figures are not published as current."""
    state = _state_after([*SERVING, Step(2, metrics=busy(10)), Step(3, answered=False)])
    assert health.load_known(state)
    assert health.published_load(state, 3.0, max_age=5.0) is None
    answered_empty = _state_after([*SERVING, Step(2, metrics=busy(10)), Step(3)])
    assert not health.load_known(answered_empty)
