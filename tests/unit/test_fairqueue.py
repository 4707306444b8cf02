"""The fair queue's decisions (`llmop_router.fairqueue`), as values: at once while a slot is free
and nobody waits; strict priority; least weighted service between tenants of one priority, with
late arrivals lifted (no banked credit) and weights honoured; sheddable refused while saturated;
a full queue refuses or displaces the newest of a lower priority; deadlines; leaving; and the
counters corrected by real usage and forgotten once the model is idle."""

from __future__ import annotations

from collections import Counter

from llmop_router.fairqueue import FULL, SHED, FairQueues, Verdict
from llmop_router.priorities import PriorityClass

MODEL = ("ns", "llama")
OTHER = ("ns", "qwen")
STANDARD = PriorityClass("standard", 0)
CLASSES = {
    "standard": STANDARD,
    "batch": PriorityClass("batch", -10),
    "mid": PriorityClass("mid", 5),
    "chat": PriorityClass("chat", 10),
    "scraper": PriorityClass("scraper", -100, sheddable=True),
}


def queues(max_requests: int = 100, max_bytes: int = 10_000) -> FairQueues:
    return FairQueues(max_requests=max_requests, max_bytes=max_bytes)


def ask(
    q: FairQueues,
    tenant: str,
    *,
    terms: PriorityClass | None = None,
    weight: int = 1,
    cost: float = 100.0,
    size: int = 10,
    now: float = 0.0,
    slots: int = 1,
    key: tuple[str, str] = MODEL,
) -> Verdict:
    return q.admit(
        key,
        tenant=tenant,
        terms=terms or CLASSES.get(tenant, STANDARD),
        weight=weight,
        cost=cost,
        size=size,
        now=now,
        wait_seconds=30.0,
        slots=slots,
    )


def done(q: FairQueues, tenant: str, correction: float = 0.0, weight: int = 1) -> None:
    q.done(MODEL, tenant, CLASSES.get(tenant, STANDARD).name, weight, correction)


def test_a_free_slot_is_taken_at_once_and_a_busy_model_queues() -> None:
    q = queues()
    assert ask(q, "a").go
    assert q.running(MODEL) == 1
    second = ask(q, "a", now=1.0)
    assert not second.go
    assert second.waiting is not None
    assert q.waiting(MODEL) == 1
    assert q.dispatch(MODEL, slots=1) == []  # still busy
    done(q, "a")
    assert q.dispatch(MODEL, slots=1) == [second.waiting]
    assert (q.waiting(MODEL), q.running(MODEL)) == (0, 1)


def test_nobody_jumps_a_queue_even_when_a_slot_is_free() -> None:
    q = queues()
    ask(q, "a")
    waiting = ask(q, "a", now=1.0).waiting
    done(q, "a")  # a slot is free, but one request waits for it
    same = ask(q, "b", now=2.0)
    assert not same.go, "its class waits already: behind it"
    assert ask(q, "chat", now=3.0).go, "a higher class would be served first anyway"
    done(q, "chat")
    assert q.dispatch(MODEL, slots=1) == [waiting]
    done(q, "a")
    assert q.dispatch(MODEL, slots=1) == [same.waiting]


def test_higher_priority_is_served_first_whatever_its_arrival() -> None:
    q = queues()
    ask(q, "batch")
    low = [ask(q, "batch", now=float(i)).waiting for i in range(1, 4)]
    high = ask(q, "chat", now=9.0).waiting
    done(q, "batch")
    assert q.dispatch(MODEL, slots=1) == [high]
    done(q, "chat")
    assert q.dispatch(MODEL, slots=3) == low  # then the rest, oldest first


def test_two_tenants_of_one_priority_share_by_service_not_by_what_they_send() -> None:
    q = queues()
    ask(q, "heavy", slots=1)
    for i in range(20):
        ask(q, "heavy", now=1.0 + i)
    for i in range(5):
        ask(q, "light", now=30.0 + i)
    served: list[str] = []
    for _ in range(10):
        done(q, served[-1] if served else "heavy")
        (item,) = q.dispatch(MODEL, slots=1)
        served.append(item.tenant)
    # The light tenant, though it arrived last, is served alternately until it has had its
    # share: FIFO would have served 20 heavy requests first.
    assert Counter(served[:10]) == {"heavy": 5, "light": 5}


def test_weights_divide_service_in_their_ratio() -> None:
    q = queues(max_requests=1000)
    ask(q, "two", weight=2)
    for i in range(300):
        ask(q, "two", weight=2, now=1.0 + i / 1000)
        ask(q, "one", weight=1, now=1.0 + i / 1000)
    served: Counter[str] = Counter()
    last = ("two", 2)
    for _ in range(300):
        done(q, last[0], weight=last[1])
        (item,) = q.dispatch(MODEL, slots=1)
        served[item.tenant] += 1
        last = (item.tenant, item.weight)
    assert served["two"] / served["one"] == 2.0


def test_a_tenant_that_starts_waiting_is_lifted_to_those_waiting() -> None:
    q = queues(max_requests=1000)
    ask(q, "a")
    for i in range(50):
        ask(q, "a", now=1.0 + i)
    for _ in range(40):  # "a" alone: its service grows while "b" is idle
        done(q, "a")
        q.dispatch(MODEL, slots=1)
    for i in range(10):
        ask(q, "b", now=100.0 + i)
    served: list[str] = []
    for _ in range(6):
        done(q, "a")
        (item,) = q.dispatch(MODEL, slots=1)
        served.append(item.tenant)
    # Without the lift "b" would take the next 40 slots (its counter at 0): it alternates.
    assert Counter(served) == {"a": 3, "b": 3}


def test_a_class_holds_at_most_its_share_and_leaves_the_rest_to_higher_classes() -> None:
    q = queues()
    batch = PriorityClass("batch", -10, max_share_percent=75)
    for i in range(3):
        assert ask(q, "batch", terms=batch, slots=4, now=float(i)).go
    held = ask(q, "batch", terms=batch, slots=4, now=3.0)
    assert held.waiting is not None, "a fourth of the slots is kept for higher classes"
    assert q.dispatch(MODEL, slots=4) == []
    assert ask(q, "chat", slots=4, now=4.0).go  # the slot kept back
    assert q.dispatch(MODEL, slots=8) == [held.waiting], "more slots: more for batch"
    assert PriorityClass("tiny", 0, max_share_percent=1).slots_of(4) == 1, "never shut out"


def test_a_class_of_lower_value_takes_a_slot_a_capped_higher_class_cannot() -> None:
    q = queues()
    capped = PriorityClass("capped", 10, max_share_percent=50)
    ask(q, "chat", terms=capped, slots=2)
    waits = ask(q, "chat", terms=capped, slots=2, now=1.0).waiting
    assert waits is not None
    low = ask(q, "batch", slots=2, now=2.0)
    assert low.go, "work-conserving: the higher class waits for its share, not the slot"
    done(q, "batch")
    assert q.dispatch(MODEL, slots=2) == []
    q.done(MODEL, "chat", "capped", 1, 0.0)
    assert q.dispatch(MODEL, slots=2) == [waits]


def test_a_class_queue_bound_refuses_past_it() -> None:
    q = queues()
    bounded = PriorityClass("bounded", 0, max_requests=2)
    ask(q, "a", terms=bounded)
    for i in range(2):
        assert ask(q, "a", terms=bounded, now=float(i)).waiting is not None
    assert ask(q, "a", terms=bounded, now=3.0).refused == FULL
    assert ask(q, "b", now=3.0).waiting is not None, "other classes still queue"
    assert q.by_class == {"bounded": 2, "standard": 1}


def test_a_sheddable_request_is_refused_while_saturated_and_served_when_not() -> None:
    q = queues()
    assert ask(q, "scraper", terms=CLASSES["scraper"]).go  # a free slot: served
    refused = ask(q, "scraper", terms=CLASSES["scraper"], now=1.0)
    assert refused.refused == SHED
    assert q.waiting(MODEL) == 0


def test_a_full_queue_refuses_or_lets_a_higher_priority_displace_the_newest_lowest() -> None:
    q = queues(max_requests=3)
    ask(q, "batch")
    old = ask(q, "batch", now=1.0).waiting
    new = ask(q, "batch", now=2.0).waiting
    mid = ask(q, "mid", now=3.0).waiting
    assert ask(q, "batch", now=4.0).refused == FULL  # nothing lower to displace
    chat = ask(q, "chat", now=5.0)
    assert chat.waiting is not None
    assert chat.displaced == new
    assert q.total == 3
    done(q, "batch")
    assert q.dispatch(MODEL, slots=3) == [chat.waiting, mid, old]


def test_the_byte_cap_holds_across_models() -> None:
    q = queues(max_bytes=100)
    ask(q, "a")
    ask(q, "a", key=OTHER)
    assert ask(q, "a", size=60, now=1.0).waiting is not None
    assert ask(q, "a", size=60, now=1.0, key=OTHER).refused == FULL
    assert q.total_bytes == 60


def test_deadlines_and_leaving_take_requests_out() -> None:
    q = queues()
    ask(q, "a")
    gone = ask(q, "a", now=1.0).waiting
    late = ask(q, "b", now=10.0).waiting
    assert gone is not None
    assert late is not None
    assert q.expire(MODEL, now=31.0) == [gone]
    assert q.leave(MODEL, late.ticket)
    assert not q.leave(MODEL, late.ticket)
    assert (q.waiting(MODEL), q.total, q.total_bytes) == (0, 0, 0)


def test_usage_corrects_the_estimate_and_an_idle_model_is_forgotten() -> None:
    q = queues()
    ask(q, "a", cost=100.0)
    ask(q, "b", now=1.0)
    # "a" used far more than estimated: its counter grows by the difference.
    done(q, "a", 900.0)
    assert q.models[MODEL].counters["a"] == 1000.0
    (item,) = q.dispatch(MODEL, slots=1)
    done(q, item.tenant, -50.0)
    assert MODEL not in q.models  # nothing waits, nothing runs: a new busy period starts even
    assert q.take_all() == []


def test_stopping_takes_everything_waiting() -> None:
    q = queues()
    ask(q, "a")
    ask(q, "a", key=OTHER)
    first = ask(q, "a", now=1.0).waiting
    second = ask(q, "b", now=1.0, key=OTHER).waiting
    assert sorted(item.ticket for _, item in q.take_all()) == sorted(
        [first.ticket, second.ticket]  # type: ignore[union-attr]
    )
    assert q.total == 0
