"""Slots lent between router pods (`llmop_router.loans`, pure), and what the fair queue tells
the other pods it has waiting (`FairQueues.best`): who a freed slot goes to, that both sides
of a loan stay each other's mirror through lends and give-backs at other endpoints, and that
a peer gone silent or restarted is forgotten."""

from __future__ import annotations

from llmop_router.fairqueue import FairQueues
from llmop_router.loans import MAX_PEERS, SILENT_SECONDS, Advert, Loans
from llmop_router.priorities import PriorityClass
from llmop_router.sharing import _adverts

MODEL = ("team", "llama")
OTHER = ("team", "mistral")
INTERACTIVE = PriorityClass(name="interactive", value=100)
BATCH = PriorityClass(name="batch", value=0)
CAPPED = PriorityClass(name="capped", value=0, max_share_percent=75)


def test_a_freed_slot_goes_to_the_peer_whose_waiting_work_outranks_this_pods() -> None:
    loans = Loans()
    loans.advertised("a", {MODEL: Advert(0, 3)})
    loans.advertised("b", {MODEL: Advert(100, 1)})
    assert loans.wanting(MODEL, None) == "b", "the highest class first"
    assert loans.wanting(MODEL, Advert(0, 5)) == "b"
    assert loans.wanting(MODEL, Advert(100, 1)) is None, "equal classes: each serves its own"
    assert loans.wanting(OTHER, None) is None, "another model's advert is not this one's"
    loans.lend("b", MODEL, "e1")
    assert loans.wanting(MODEL, None) == "a", "b's one request is covered by the loan"
    assert loans.wanting(MODEL, Advert(0, 1)) is None
    loans.advertised("b", {MODEL: Advert(100, 1)})
    assert loans.wanting(MODEL, None) == "b", "a new advert counts afresh"


def test_a_borrowed_slot_stays_only_while_what_waits_here_outranks_the_lenders() -> None:
    loans = Loans()
    loans.borrowed("a", MODEL, "e1")
    assert loans.owed(MODEL) == ["a"]
    assert not loans.keeps(MODEL, "a", None), "nothing waits here: back"
    assert loans.keeps(MODEL, "a", Advert(0, 1)), "the lender has nothing waiting"
    loans.advertised("a", {MODEL: Advert(0, 2)})
    assert not loans.keeps(MODEL, "a", Advert(0, 1)), "equal: the lender's own slot"
    assert loans.keeps(MODEL, "a", Advert(100, 1))


def test_both_sides_of_a_loan_mirror_each_other_through_a_give_back_elsewhere() -> None:
    lender, borrower = Loans(), Loans()
    lender.lend("B", MODEL, "e2")
    borrower.borrowed("A", MODEL, "e2")
    assert (lender.net(MODEL), borrower.net(MODEL)) == (-1, 1)
    assert (lender.at(MODEL, "e2"), borrower.at(MODEL, "e2")) == (-1, 1)
    # The borrower's request at e1 finished: the slot it gives back is there.
    borrower.give_back("A", MODEL, "e1")
    lender.given_back("B", MODEL, "e1")
    assert (lender.net(MODEL), borrower.net(MODEL)) == (0, 0)
    assert borrower.owed(MODEL) == []
    for endpoint in ("e1", "e2"):
        assert lender.at(MODEL, endpoint) == -borrower.at(MODEL, endpoint)
    assert (borrower.at(MODEL, "e2"), borrower.at(MODEL, "e1")) == (1, -1)
    assert borrower.busy(), "an endpoint's count moved: still worth a beat"


def test_a_peer_that_restarted_or_went_silent_is_forgotten() -> None:
    loans = Loans()
    assert loans.hear("b", 0, now=0.0) == (True, set())
    loans.lend("b", MODEL, "e1")
    loans.advertised("b", {MODEL: Advert(100, 2), OTHER: Advert(0, 1)})
    assert loans.silent(SILENT_SECONDS) == []
    assert loans.silent(SILENT_SECONDS + 0.1) == ["b"]
    assert loans.forget("b") == {MODEL, OTHER}
    assert (loans.net(MODEL), loans.wanting(MODEL, None), loans.busy()) == (0, None, False)
    loans.borrowed("c", MODEL, "e1")
    loans.lend("d", OTHER, "e9")
    assert loans.forget_all() == {MODEL, OTHER}
    assert not loans.held


def test_an_advert_without_a_model_drops_it_and_peers_are_bounded() -> None:
    loans = Loans()
    assert loans.advertised("b", {MODEL: Advert(0, 1)}) == {MODEL}
    assert loans.advertised("b", {MODEL: Advert(0, 1)}) == set(), "unchanged"
    assert loans.advertised("b", {}) == {MODEL}
    assert loans.wanting(MODEL, None) is None
    for n in range(MAX_PEERS):
        assert loans.hear(f"p{n}", 0, now=1.0)[0]
    assert not loans.hear("one-too-many", 0, now=1.0)[0]
    assert loans.hear("p0", 0, now=2.0)[0], "a known peer still is"


def test_a_peers_new_epoch_forgets_its_loans_and_its_old_epoch_is_not_read() -> None:
    loans = Loans()
    assert loans.hear("b", 3, now=0.0) == (True, set())
    loans.borrowed("b", MODEL, "e1")
    loans.advertised("b", {OTHER: Advert(100, 1)})
    assert loans.hear("b", 3, now=0.5) == (True, set()), "the same epoch"
    # b missed messages (it subscribed again): what it lent here is forgotten with it.
    assert loans.hear("b", 4, now=1.0) == (True, {MODEL, OTHER})
    assert not loans.held
    assert loans.wanting(OTHER, None) is None
    assert loans.hear("b", 3, now=1.1) == (False, set()), "a message from before it"


def test_a_peers_message_is_read_only_where_well_formed() -> None:
    raw = [
        ["team", "llama", 100, 2],
        ["team", "bad", "100", 2],
        ["team", "bool", True, 1],
        ["short", 1],
        "not a list",
    ]
    assert _adverts(raw) == {MODEL: Advert(100, 2)}
    assert _adverts({"team": 1}) == {}
    assert len(_adverts([["t", f"m{n}", 0, 1] for n in range(5000)])) == 1000


def _admit(queues: FairQueues, terms: PriorityClass, n: int, slots: int, share: int) -> bool:
    """Request n of `terms` for MODEL; whether it went at once."""
    verdict = queues.admit(
        MODEL,
        tenant=f"t{n}",
        terms=terms,
        weight=1,
        cost=1.0,
        size=0,
        now=float(n),
        wait_seconds=5.0,
        slots=slots,
        share=share,
    )
    return verdict.go


def test_what_waits_is_advertised_only_where_one_more_slot_would_serve_it() -> None:
    queues = FairQueues(max_requests=100, max_bytes=1 << 20)
    went = [_admit(queues, terms, n, 1, 1) for n, terms in enumerate((BATCH, BATCH, INTERACTIVE))]
    assert went == [True, False, False]
    assert queues.best(MODEL, 1) == (100, 1), "the highest class, and how many of it"
    assert queues.best(OTHER, 1) is None
    # A class held to 75 % of the pod's own 4 slots, 3 of them running, waits for its own.
    capped = FairQueues(max_requests=100, max_bytes=1 << 20)
    assert [_admit(capped, CAPPED, n, 4, 4) for n in range(5)] == [True] * 3 + [False] * 2
    assert capped.best(MODEL, 4) is None, "a lent slot could not serve it"
    assert capped.dispatch(MODEL, 5, share=4) == [], "nor does a borrowed slot"
    assert capped.best(MODEL, 8) == (0, 2), "of 8 own slots it may hold 6"
