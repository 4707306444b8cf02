"""The fair queue's slots corrected by the engines' own counts (`llmop_router.engine_load`):
what a vLLM `/metrics` page says, when a queue in the engine cuts this pod's limit there, by
how much, and how the limit grows back and ends."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from llmop_router.engine_load import (
    FLOOR,
    MAX_PROBE_SECONDS,
    PROBE_SECONDS,
    STALE_SECONDS,
    EngineLoad,
    Reading,
    parse,
)
from llmop_router.limits import DEFAULT as DEFAULT_LIMITS
from llmop_router.metrics import QueueMetrics
from llmop_router.routes import RouteTable, Wake
from llmop_router.sharing import Sharing

KEY = ("team", "llama")
E = "10.0.0.1:8000"

VLLM_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_running{engine="1",model_name="llama"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 4.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 0.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="llama",reason="capacity"} 4.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="llama",reason="deferred"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.93
"""


def test_a_vllm_page_is_summed_over_its_engine_cores_and_nothing_else_counts() -> None:
    assert parse(VLLM_PAGE) == Reading(running=5, waiting=4)
    assert parse("vllm:num_requests_running 7\nvllm:num_requests_waiting 1 1700000000\n") == (
        Reading(7, 1)
    )
    assert parse('vllm:num_requests_running{model_name="a}b"} 2.0\n') == Reading(2, 0)


def test_a_page_without_the_counts_or_with_nonsense_in_them_is_no_reading() -> None:
    assert parse("") is None
    assert parse("# just a comment\nprocess_cpu_seconds_total 12\n") is None
    assert parse("vllm:num_requests_running NaN\nvllm:num_requests_waiting -3\n") is None
    assert parse('vllm:num_requests_running{engine="0"}\nvllm:num_requests_waiting x\n') is None


def read(load: EngineLoad, reading: Reading, now: float, *, mine: int, entitled: int = 8) -> bool:
    return load.read(KEY, E, reading, mine=mine, entitled=entitled, now=now)


def test_one_reading_with_requests_waiting_is_a_request_between_steps_not_a_queue() -> None:
    load = EngineLoad()
    assert not read(load, Reading(8, 1), 0.0, mine=8)
    assert load.cut(KEY, E) == 0
    assert not load.limits, "the fair queue's fast path: no model with a cut"
    read(load, Reading(8, 0), 0.5, mine=8)
    read(load, Reading(8, 1), 1.0, mine=8)
    assert load.cut(KEY, E) == 0, "not two in a row"


def test_a_queue_in_two_readings_cuts_this_pods_part_of_it() -> None:
    # A KV-bound engine: the plan says 8 a pod, two pods send 8 each, it runs 8 and 8 wait.
    load = EngineLoad()
    read(load, Reading(8, 8), 0.0, mine=8)
    read(load, Reading(8, 8), 0.5, mine=8)
    # This pod holds half of what the engine holds: half of the 8 waiting are its.
    assert load.cut(KEY, E) == 4
    assert load.cuts(KEY) == {E: 4}
    # A deeper queue cuts further; a shallower one does not raise it while it lasts.
    read(load, Reading(8, 12), 1.0, mine=8)
    assert load.cut(KEY, E) == 5
    read(load, Reading(8, 1), 1.5, mine=4)
    assert load.cut(KEY, E) == 5


def test_a_queue_of_others_leaves_this_pod_one_request_at_a_time() -> None:
    load = EngineLoad()
    read(load, Reading(8, 30), 0.0, mine=1)
    read(load, Reading(8, 30), 0.5, mine=1)
    assert load.cut(KEY, E) == 8 - FLOOR
    read(load, Reading(8, 30), 1.0, mine=0)
    assert load.cut(KEY, E) == 8 - FLOOR


def test_room_eases_the_cut_one_a_reading_until_the_plan_and_then_it_ends() -> None:
    load = EngineLoad()
    read(load, Reading(8, 8), 0.0, mine=8)
    read(load, Reading(8, 8), 0.5, mine=8)
    assert load.cut(KEY, E) == 4, "half of what the engine holds is this pod's"
    # The other pod's requests end: the engine runs 5, fewer than when it queued. Once is a
    # slot between two requests; twice, room.
    assert not read(load, Reading(5, 0), 1.0, mine=4)
    assert load.cut(KEY, E) == 4
    for step, sent in enumerate((5, 6, 7)):
        assert read(load, Reading(5, 0), 1.5 + step / 2, mine=sent - 1)
        assert load.cut(KEY, E) == 8 - sent
    assert not read(load, Reading(5, 0), 3.0, mine=3), "this pod does not use its 7: no proof"
    assert not read(load, Reading(7, 0), 3.5, mine=7), "room again: once, then twice"
    assert read(load, Reading(7, 0), 4.0, mine=7)
    assert load.cut(KEY, E) == 0, "at the plan's 8: no cut"
    assert not load.limits
    assert not read(load, Reading(8, 0), 4.5, mine=8), "nothing to grow"


def test_an_engine_as_full_as_when_it_queued_is_probed_less_often_each_time_it_queues() -> None:
    load = EngineLoad()
    read(load, Reading(8, 8), 0.0, mine=8)
    read(load, Reading(8, 8), 0.5, mine=8)
    assert load.cut(KEY, E) == 4
    for moment in (1.0, 2.0, 0.5 + PROBE_SECONDS - 0.1):
        assert not read(load, Reading(8, 0), moment, mine=4)
        assert load.cut(KEY, E) == 4, "more would queue again"
    assert read(load, Reading(8, 0), 0.5 + PROBE_SECONDS, mine=4)
    assert load.cut(KEY, E) == 3
    # The probe queued: cut back, and the next probe waits twice as long.
    read(load, Reading(8, 1), 6.0, mine=5)
    read(load, Reading(8, 1), 6.5, mine=5)
    assert load.cut(KEY, E) == 4
    assert not read(load, Reading(8, 0), 6.5 + PROBE_SECONDS, mine=4)
    assert read(load, Reading(8, 0), 6.5 + 2 * PROBE_SECONDS, mine=4)
    assert load.cut(KEY, E) == 3
    # That probe held (no queue by the next): the engine takes more now, probes as at first.
    assert read(load, Reading(8, 0), 6.5 + 4 * PROBE_SECONDS, mine=5)
    assert read(load, Reading(8, 0), 6.5 + 5 * PROBE_SECONDS, mine=6)
    assert load.cut(KEY, E) == 1


def test_probes_that_keep_queueing_wait_at_most_a_minute() -> None:
    load = EngineLoad()
    now = 0.0
    for _ in range(12):
        read(load, Reading(8, 8), now, mine=8)
        read(load, Reading(8, 8), now + 0.5, mine=8)
        now += 0.5
        while not read(load, Reading(8, 0), now, mine=4):
            now += 0.5
    read(load, Reading(8, 1), now + 0.5, mine=5)
    read(load, Reading(8, 1), now + 1.0, mine=5)
    assert not read(load, Reading(8, 0), now + 1.0 + MAX_PROBE_SECONDS - 0.5, mine=4)
    assert read(load, Reading(8, 0), now + 1.0 + MAX_PROBE_SECONDS, mine=4)


def test_a_correction_no_reading_confirms_runs_out() -> None:
    load = EngineLoad()
    read(load, Reading(8, 8), 0.0, mine=8)
    read(load, Reading(8, 8), 0.5, mine=8)
    assert load.expire(0.5 + STALE_SECONDS) == set()
    assert load.cut(KEY, E) == 4
    assert load.expire(0.6 + STALE_SECONDS) == {KEY}
    assert load.cut(KEY, E) == 0
    assert not load.limits
    # A queue seen long ago and one seen now are not two in a row.
    read(load, Reading(8, 8), 10.0, mine=8)
    assert load.cut(KEY, E) == 0


def test_a_single_queued_reading_keeps_a_cut_alive_without_easing_it() -> None:
    load = EngineLoad()
    read(load, Reading(8, 8), 0.0, mine=8)
    read(load, Reading(8, 8), 0.5, mine=8)
    read(load, Reading(6, 0), 1.0, mine=4)
    read(load, Reading(6, 0), 1.5, mine=4)
    assert load.cut(KEY, E) == 3
    read(load, Reading(5, 1), 1.5 + STALE_SECONDS - 0.1, mine=5)
    assert load.expire(1.5 + STALE_SECONDS) == set()
    assert load.cut(KEY, E) == 3


def test_a_slot_lent_between_two_pods_moves_on_top_of_their_cuts() -> None:
    """The cut is the pod's, not the slot's: a slot lent to the other pod leaves the two pods'
    slots summing to what the engine runs, so the borrower can use it and the lender does not
    fill it again."""
    pods = []
    for _ in range(2):
        table = RouteTable()
        table.set("llama", *KEY, [E], Wake(concurrency=16))  # the plan: 16; the engine runs 8
        sharing = Sharing(table, QueueMetrics(CollectorRegistry()), DEFAULT_LIMITS)
        sharing.replicas = 2
        read(sharing.load, Reading(8, 8), 0.0, mine=8)
        read(sharing.load, Reading(8, 8), 0.5, mine=8)
        pods.append((sharing, table.backends["llama"]))
    (a, backend_a), (b, backend_b) = pods
    assert a.slots(backend_a) == b.slots(backend_b) == 4
    a.loans.lend("b", KEY, E)
    b.loans.borrowed("a", KEY, E)
    assert (a.slots(backend_a), b.slots(backend_b)) == (3, 5)
    assert a.metrics.withheld.collect()[0].samples[0].value == 4
