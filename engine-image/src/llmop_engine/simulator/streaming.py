"""The events of one streamed answer, as its requests advance in the engine (no I/O).

`Stream.advance()` is called each time the engine moved one of the answer's requests (one per
prompt); it returns the SSE text to write now and what the server does after writing it:
`MORE` (wait for the engine), `END` (close the body), or a request fault (`request_faults`):
`crash` (drop the connection), `hang` (write nothing more, keep it open), `cut` and `error` (the
body ends with what was returned; the engine's requests are aborted).

Order and content follow vLLM 0.32 (`openai_shapes` has the field shapes): chat's role chunk rides
with the first output; one chunk per token with its text (held back for stop strings) and id, or
with `--stream-interval N` one chunk per N tokens (their texts and ids together; the first token
and the finish go at once, as vLLM's `RequestState.make_request_output` sends them); the
finish reason on the last token's chunk for "length" and "stop", on a chunk of its own without
ids for an abort (carrying the held-back text); no choice at all for a prompt aborted before its
first token; the usage chunk when asked for; `[DONE]`, except after an engine error, where the
simulator's stream has always ended without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmop_engine.simulator.batching import SimRequest
from llmop_engine.simulator.decoding import Plan
from llmop_engine.simulator.openai_shapes import DONE, StreamShape, error_event

MORE = "more"
END = "end"


@dataclass
class Job:
    """One prompt of an answer: its engine request, prompt ids and planned output."""

    req: SimRequest
    prompt_ids: tuple[int, ...]
    plan: Plan
    sent: int = 0
    opened: bool = False
    """Its first chunk went out (chat's role chunk, completions' prompt ids)."""
    closed: bool = False
    """Its finish went out."""


class Stream:
    def __init__(
        self,
        shape: StreamShape,
        jobs: Sequence[Job],
        *,
        include_usage: bool,
        fault: tuple[str, int] | None = None,
        interval: int = 1,
    ) -> None:
        self.shape = shape
        self.jobs = list(jobs)
        self.include_usage = include_usage
        self.interval = max(1, interval)
        # A fault at or past the first prompt's planned end never fires.
        self.fault = fault if fault is not None and fault[1] < len(jobs[0].plan.ids) else None

    def advance(self) -> tuple[str, str]:
        parts: list[str] = []
        for index, job in enumerate(self.jobs):
            limit = job.req.generated
            if index == 0 and self.fault is not None:
                limit = min(limit, self.fault[1])
            faulting = index == 0 and self.fault is not None and limit == self.fault[1]
            while job.sent < limit:
                count = self._batch(job, limit, faulting)
                if not count:
                    break
                parts.append(self._token(index, job, count))
            if index == 0 and self.fault is not None and job.sent == self.fault[1]:
                return self._fault(parts)
            if job.req.finished and job.sent == job.req.generated and not job.closed:
                parts.append(self._finish(index, job))
        if all(job.req.finished and job.closed for job in self.jobs):
            if self.include_usage:
                parts.append(self._usage())
            if not any(job.req.finish_reason == "error" for job in self.jobs):
                parts.append(DONE)
            return "".join(parts), END
        return "".join(parts), MORE

    def _open(self, index: int, job: Job) -> str:
        job.opened = True
        return self.shape.role(index, job.prompt_ids) if self.shape.chat else ""

    def _batch(self, job: Job, limit: int, faulting: bool) -> int:
        """How many of the generated tokens the next chunk carries (0: wait for more): all of
        them at the finish or a fault (a dying engine's buffered tokens go out as they are in
        the simulator: its fault fires after exactly N tokens), one for the first token."""
        pending = limit - job.sent
        if job.sent == 0 or self.interval == 1:
            return 1
        if pending >= self.interval or faulting or job.req.finished:
            return pending
        return 0

    def _token(self, index: int, job: Job, count: int = 1) -> str:
        head = "" if job.opened else self._open(index, job)
        k = job.sent
        job.sent += count
        plan, req = job.plan, job.req
        final = (
            req.finished and job.sent == req.generated and req.finish_reason in ("length", "stop")
        )
        if final:
            job.closed = True
        return head + self.shape.token(
            index,
            "".join(plan.texts[k : k + count]),
            plan.ids[k : k + count],
            finish=req.finish_reason if final else None,
            stop_reason=plan.stop_reason if final and req.finish_reason == "stop" else None,
            prompt_ids=None if k else job.prompt_ids,
        )

    def _finish(self, index: int, job: Job) -> str:
        """The finish of a request that ended without a token of its own (abort, error)."""
        job.closed = True
        reason = job.req.finish_reason
        if job.sent == 0 and reason == "abort":
            return ""  # vLLM sends no choice for a prompt aborted before its first token
        head = "" if job.opened else self._open(index, job)
        text = job.plan.flush(job.sent) if reason == "abort" else ""
        return head + self.shape.token(index, text, [], finish=reason)

    def _usage(self) -> str:
        prompt = sum(len(job.prompt_ids) for job in self.jobs)
        return self.shape.usage(prompt, sum(job.sent for job in self.jobs))

    def _fault(self, parts: list[str]) -> tuple[str, str]:
        assert self.fault is not None
        kind = self.fault[0]
        if kind == "cut":
            for index, job in enumerate(self.jobs):
                if not job.closed and job.sent:
                    job.closed = True
                    parts.append(
                        self.shape.token(index, job.plan.flush(job.sent), [], finish="abort")
                    )
            if self.include_usage:
                parts.append(self._usage())
            parts.append(DONE)
        elif kind == "error":
            parts.append(error_event("Internal server error"))
        return "".join(parts), kind
