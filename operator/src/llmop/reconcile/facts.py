"""What this process knows of the files of models outside the catalog (`llmop.model_facts`),
one `FactsMemory` per term (`Context.facts`): the facts read, by (model, revision), and the
reads asked for — by which parents, answered how, due when.

The reconcile only asks and looks (`want`, without I/O: a parse registers the parent and gets
the answer known now); `llmop.facts_check` reads the files in the background (`take_due`,
`settle`) and puts the waiting parents' passes on the queue when an answer comes.

Bounded: at most `CAPACITY` models' facts, the least recently used dropped first (a parent whose
facts were dropped has them read again, keeping its engines and last plan meanwhile); a read
is kept only while a parent that still exists waits for it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from llmop.model_facts import Answer, FactsRequest, Read, Refused, Unavailable

Key = tuple[str, str]
Generation = tuple[str, int | None]

CAPACITY = 512
"""Models whose facts are kept (a few KiB each)."""
REFUSED_RETRY_SECONDS = 600.0
"""A refusal (no such model or revision, a gated model without access, a config the planner
cannot size) is asked again this long after, even with no change to the spec: access granted
on the Hub or a branch pushed then shows without an edit. A new generation asks at once."""


@dataclass
class _Ask:
    """One read asked for: its answer so far (None: not answered yet), the parents waiting
    and the generation each asked for, and when it is due again."""

    answer: Refused | Unavailable | None = None
    parents: dict[Key, Generation] = field(default_factory=dict)
    due: float = 0.0
    busy: bool = False
    attempts: int = 0


class FactsMemory:
    """The facts read and the reads asked for; safe to use from any thread."""

    def __init__(
        self, capacity: int = CAPACITY, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._capacity = capacity
        self._clock = clock
        self._lock = threading.Lock()
        self._read: OrderedDict[tuple[str, str], Read] = OrderedDict()
        self._asks: dict[FactsRequest, _Ask] = {}
        self._wake = threading.Event()

    def want(self, request: FactsRequest, parent: Key, generation: Generation) -> Answer | None:
        """The answer known now for `request` (None: not read yet), registering `parent` as
        waiting for it when there are no facts: a new read is due at once, and a refusal is
        asked again at once for a new generation (access may have been granted, a branch
        pushed), else `REFUSED_RETRY_SECONDS` after it came."""
        wake = False
        with self._lock:
            read = self._read.get(request.files)
            if read is not None:
                self._read.move_to_end(request.files)
                return read
            ask = self._asks.get(request)
            if ask is None:
                ask = self._asks[request] = _Ask(due=self._clock())
                wake = True
            elif isinstance(ask.answer, Refused) and ask.parents.get(parent) != generation:
                ask.answer, ask.due, ask.attempts = None, self._clock(), 0
                wake = True
            ask.parents[parent] = generation
            answer = ask.answer
        if wake:
            self._wake.set()
        return answer

    def take_due(self, alive: Callable[[Key], bool]) -> list[tuple[FactsRequest, int]]:
        """The reads due now, each with the number of its attempt, marked as under way. Parents
        for which `alive` is False are dropped first, and reads no parent waits for with them."""
        now = self._clock()
        due: list[tuple[FactsRequest, int]] = []
        with self._lock:
            for request, ask in list(self._asks.items()):
                for key in [k for k in ask.parents if not alive(k)]:
                    del ask.parents[key]
                if not ask.parents and not ask.busy:
                    del self._asks[request]
                    continue
                if ask.busy or ask.due > now:
                    continue
                ask.busy = True
                due.append((request, ask.attempts + 1))
        return due

    def settle(self, request: FactsRequest, answer: Answer) -> list[Key]:
        """Store the answer to `request`'s read; returns the parents to plan again. Facts
        answer every read of the same model and revision, whatever its token."""
        with self._lock:
            if isinstance(answer, Read):
                self._read[request.files] = answer
                self._read.move_to_end(request.files)
                while len(self._read) > self._capacity:
                    self._read.popitem(last=False)
                parents: set[Key] = set()
                for other in [r for r in self._asks if r.files == request.files]:
                    parents |= set(self._asks.pop(other).parents)
                return sorted(parents)
            ask = self._asks.get(request)
            if ask is None:
                return []
            ask.busy = False
            ask.answer = answer
            if isinstance(answer, Unavailable):
                ask.attempts = answer.attempts
                ask.due = self._clock() + answer.retry_in
            else:
                ask.attempts = 0
                ask.due = self._clock() + REFUSED_RETRY_SECONDS
            return sorted(ask.parents)

    def seconds_to_next(self) -> float | None:
        """Seconds until the next read is due (0: one is due now); None: none is waiting."""
        now = self._clock()
        with self._lock:
            dues = [a.due for a in self._asks.values() if not a.busy]
        return None if not dues else max(0.0, min(dues) - now)

    def wait(self, timeout: float) -> None:
        """Sleep until a new read is asked for, or `timeout` seconds."""
        if self._wake.wait(timeout):
            self._wake.clear()

    def __len__(self) -> int:
        """Models whose facts are kept."""
        with self._lock:
            return len(self._read)
