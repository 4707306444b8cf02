"""Pure: request migration, the bookkeeping that lets a stream whose engine failed after its
first byte continue on another replica, token for token.

For an eligible streaming request (`refusal` says which are not, and why) the router asks the
engine for token ids (`return_token_ids`, vLLM ≥ 0.10.2), and a `Record` watches every event it
forwards: the prompt's ids `P`, the ids `G` of the events the client actually received, the
answer's identity (`id`, `created`, `model`). When the upstream fails, `continuation` is the
request to send to another replica: `prompt = P + G` with the budgets reduced by `|G|`
(completions), or the same messages with `kv_transfer_params.prompt_token_ids = P + G` (chat,
vLLM ≥ 0.32, PR #48145: chat-shaped output, the engine's own parsers). `Record.see` then
rewrites the continuation's events as if they were the first attempt's: same identity, no second
role chunk, no router-asked ids, usage counted over all attempts (`prompt_tokens = |P|`,
`completion_tokens = |G| + new`). Research, pitfalls and citations:
`../shared/reference/request-migration.md`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""vLLM's `CompletionRequest.max_tokens` default: an omitted budget is this, not unbounded."""
DONE = b"data: [DONE]\n\n"

STRIPPED_FROM_COMPLETIONS = ("echo", "suffix", "prompt_logprobs", "truncate_prompt_tokens")
"""Prompt transformations the ids already contain (or that would echo `P + G`)."""
GUIDED = ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar")


@dataclass(frozen=True)
class Settings:
    """How the router migrates (router flags; a CR field later, see docs/router.md)."""

    limit: int = 2
    """Migrations per request; 0 turns migration off (a failed stream still ends with an
    error event, never silently)."""
    inactivity_seconds: float = 30.0
    """No event for this long after the first byte: the engine is taken as hung."""
    unready_idle_seconds: float = 2.0
    """No event for this long while the endpoint is no longer in the route table: hung (a pod
    that left the ready set while its stream stalls)."""


def stream_body(method: str, path: str, body: bytes) -> dict[str, Any] | None:
    """The parsed body of a streaming completions or chat request, else None (those requests
    are relayed as bytes, untouched)."""
    if method != "POST" or path not in (COMPLETIONS, CHAT) or b'"stream"' not in body:
        return None
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or parsed.get("stream") is not True:
        return None
    return parsed


def _set(value: object) -> bool:
    return value is not None and value is not False and value != 0


def refusal(path: str, body: dict[str, Any]) -> str | None:
    """Why this streaming request cannot be continued exactly (its state is not all in the
    tokens); None when it can. Decided once, from the body."""
    for check in (_choices_refusal, _sampling_refusal, _format_refusal):
        why = check(body)
        if why is not None:
            return why
    return _prompt_refusal(body) if path == COMPLETIONS else _messages_refusal(body)


def _choices_refusal(body: dict[str, Any]) -> str | None:
    n = body.get("n")
    if n is not None and n != 1:
        return "n > 1"
    best_of = body.get("best_of")
    if (best_of is not None and best_of != 1) or body.get("use_beam_search"):
        return "best_of or beam search"
    if _set(body.get("echo")):
        return "echo"
    if _set(body.get("logprobs")) or _set(body.get("top_logprobs")):
        return "logprobs"
    return None


def _sampling_refusal(body: dict[str, Any]) -> str | None:
    if body.get("stop") and stop_strings(body) is None:
        return "stop strings the router cannot match (not strings, or too many or too long)"
    if body.get("seed") is not None and body.get("temperature") != 0:
        # A seeded sampler restarts at draw 0 on the continuation: not reproducible.
        return "seeded sampling"
    if _set(body.get("frequency_penalty")) or _set(body.get("presence_penalty")):
        # They count output tokens; after a seam the output so far is prompt.
        return "frequency or presence penalty"
    return None


def _format_refusal(body: dict[str, Any]) -> str | None:
    """Grammar state (structured output, a forced tool choice: vLLM implements it with a
    JSON schema) is not in the tokens: a fresh grammar would restart mid-document."""
    format_ = body.get("response_format")
    if isinstance(format_, dict) and format_.get("type") not in (None, "text"):
        return "structured output"
    if any(body.get(key) is not None for key in GUIDED):
        return "structured output"
    tool_choice = body.get("tool_choice")
    if tool_choice == "required" or isinstance(tool_choice, dict):
        return "forced tool choice"
    if body.get("prompt_embeds") is not None:
        return "prompt embeddings"
    return None


def _prompt_refusal(body: dict[str, Any]) -> str | None:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return None
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return None
    return "a batch of prompts"


def _messages_refusal(body: dict[str, Any]) -> str | None:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return "no messages"
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(
            not isinstance(part, dict) or part.get("type") != "text" for part in content
        ):
            # The ids hold placeholders, not the media (vLLM ignores forwarded ids then).
            return "media input"
    return None


MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 512
ROUTER_STOP_KEYS = ("stop", "include_stop_str_in_output")
"""Taken out of an eligible request before it goes upstream: the router matches its stop
strings itself (`Stops`)."""


def stop_strings(body: dict[str, Any]) -> tuple[str, ...] | None:
    """The request's `stop` as strings the router can match (a string, or a list of at most
    `MAX_STOP_STRINGS` non-empty ones of at most `MAX_STOP_CHARS` each); () for none; None
    when it is something else (left to the engine, and the request not continued)."""
    raw = body.get("stop")
    if not raw:
        return ()
    listed = [raw] if isinstance(raw, str) else raw
    if (
        not isinstance(listed, list)
        or len(listed) > MAX_STOP_STRINGS
        or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in listed)
    ):
        return None
    return tuple(listed)


def check_stop_strings(
    text: str, new_chars: int, stops: tuple[str, ...], include: bool
) -> tuple[str, int] | None:
    """vLLM 0.32's `check_stop_strings` (`v1/engine/detokenizer.py`, as the simulator's
    `decoding` models it): the stop string completing earliest in the new text (searched over
    it and the `len(stop) - 1` characters before it), ties by list order, and the offset to
    cut the text to (-1: none)."""
    if not new_chars:
        return None
    best: str | None = None
    best_index, best_end = 0, len(text) + 1
    for candidate in stops:
        index = text.find(candidate, max(0, len(text) + 1 - new_chars - len(candidate)))
        if index != -1 and index + len(candidate) < best_end:
            best, best_index, best_end = candidate, index, index + len(candidate)
    if best is None:
        return None
    if include:
        return best, (-1 if best_end >= len(text) else best_end)
    return best, best_index


@dataclass
class Stops:
    """A stream's stop strings, matched by the router over the whole answer as vLLM matches
    them, so that one spanning a seam is found and no held-back text is lost: the engines never
    see them (`ROUTER_STOP_KEYS`), the router holds back the last `max(len) - 1` characters
    (vLLM's `stop_buffer_length`) until they cannot start one, and ends the answer at a match
    (finish "stop", `stop_reason` the string, the text cut before it, or after it with
    `include_stop_str_in_output`). Checked only once more than `min_tokens` tokens exist."""

    strings: tuple[str, ...]
    include: bool = False
    min_tokens: int = 0
    text: str = ""
    """The answer's text (completions: `text`; chat: `content`), from `offset` on."""
    offset: int = 0
    emitted: int = 0
    """Characters of the answer sent to the client."""
    reach: int = 0
    """At a match: the characters of the event's new text up to the end of the stop string
    (which of its tokens completed it: `StopChunk`)."""
    skip: int | None = None
    """For the next event only: the characters of its text before its first token past
    `min_tokens`, where the search begins (`MinTokensSpan`); None: the whole event's."""

    KEEP: ClassVar[int] = 4096
    """Text already sent is dropped past this much (the search needs `max(len) - 1` of it)."""

    @classmethod
    def of(cls, body: dict[str, Any]) -> Stops | None:
        strings = stop_strings(body)
        if not strings:
            return None
        minimum = body.get("min_tokens")
        return cls(
            strings,
            include=body.get("include_stop_str_in_output") is True,
            min_tokens=minimum if isinstance(minimum, int) and minimum > 0 else 0,
        )

    @property
    def hold(self) -> int:
        return 0 if self.include else max(len(s) for s in self.strings) - 1

    def step(self, new: str, tokens: int, finished: bool) -> tuple[str, str | None]:
        """One event's new text, with `tokens` generated so far (this event's included) and
        whether the engine finished the answer: the text to send now, and the stop string
        that ends the answer here (None)."""
        skip, self.skip = self.skip or 0, None
        self.text += new
        end = self.offset + len(self.text)
        if len(new) > skip and tokens > self.min_tokens:
            found = check_stop_strings(self.text, len(new) - skip, self.strings, self.include)
            if found is not None:
                stop, cut = found
                # vLLM's `stop_end`: where the match ends (`include`: where the text is cut).
                match_end = cut if cut >= 0 else len(self.text)
                self.reach = (
                    match_end + (0 if self.include else len(stop)) - (len(self.text) - len(new))
                )
                if cut >= 0:
                    self.text = self.text[:cut]
                return self._send(self.offset + len(self.text)), stop
        out = self._send(end if finished else end - self.hold)
        keep = min(self.emitted, end - self.KEEP)
        if keep > self.offset:
            self.text = self.text[keep - self.offset :]
            self.offset = keep
        return out, None

    def flush(self) -> str:
        """What is still held back, for a finish the router writes itself."""
        return self._send(self.offset + len(self.text))

    def _send(self, upto: int) -> str:
        if upto <= self.emitted:
            return ""
        out = self.text[self.emitted - self.offset : upto - self.offset]
        self.emitted = upto
        return out


STOP_CHUNK_MAX_IDS = 64
"""An event of more tokens than this completing a stop string keeps them all (not decoded)."""
DECODE_CONTEXT = 6
"""Ids before the event decoded with it, so its first token's text is what a stream shows (a
leading space) and not a sequence's start (vLLM's incremental detokenizer reads 5 back)."""


@dataclass(frozen=True)
class StopChunk:
    """The event whose text completed a stop string carried several tokens (an engine's
    `--stream-interval`, or vLLM's output collector merging steps when the reader lags), and
    the engine, which never saw the stop strings, sent the tokens after the one that completed
    it too. vLLM keeps only the tokens up to that one (`BaseIncrementalDetokenizer.update`:
    `bisect_left(token_offsets, stop_end)`); which one it is comes from decoding growing
    prefixes of the event's ids with the engine's own tokenizer (`prefixes`, `kept`)."""

    ids: tuple[int, ...]
    context: tuple[int, ...]
    reach: int
    """Characters of the event's text up to the end of the stop string."""

    def prefixes(self) -> list[list[int]]:
        """What to decode: the context alone, then with the event's first 1 … n-1 ids (all n
        are kept when none of those reaches the match)."""
        return [[*self.context, *self.ids[:k]] for k in range(len(self.ids))]

    def kept(self, texts: Sequence[str | None]) -> int:
        """How many of the event's ids to keep, from the decoded `prefixes` (None: that one
        could not be decoded, and every id is kept, as before decoding was tried)."""
        if len(texts) != len(self.ids) or texts[0] is None:
            return len(self.ids)
        base = _streamed_length(texts[0])
        for k, text in enumerate(texts[1:], 1):
            if text is None:
                return len(self.ids)
            if _streamed_length(text) - base >= self.reach:
                return k
        return len(self.ids)


@dataclass(frozen=True)
class MinTokensSpan:
    """An event of several tokens whose last ones pass `min_tokens` (`--stream-interval`, or
    merged steps). vLLM checks the stop strings token by token once more than `min_tokens`
    exist, so only a match ending in the text of those later tokens counts; where that text
    begins in the event comes from decoding the event's first `before` ids after the context
    (`prefixes`, `offset`)."""

    ids: tuple[int, ...]
    """The event's ids up to the `min_tokens`-th of the answer."""
    context: tuple[int, ...]

    def prefixes(self) -> list[list[int]]:
        return [list(self.context), [*self.context, *self.ids]]

    def offset(self, texts: Sequence[str | None]) -> int:
        """Characters of the event's text before its first token past `min_tokens`, from the
        decoded `prefixes`; 0 when they were not decoded (the whole event is searched)."""
        if len(texts) != 2 or texts[0] is None or texts[1] is None:
            return 0
        return max(0, _streamed_length(texts[1]) - _streamed_length(texts[0]))


def _streamed_length(decoded: str) -> int:
    """The length a stream shows of a decoded prefix: a decode that ends inside a character
    (a byte-level token of a multi-byte one) ends in U+FFFD, which vLLM's incremental
    detokenizer (tokenizers' `DecodeStream`) holds back until the character is complete."""
    return len(decoded.rstrip("\ufffd"))


def first_body(body: dict[str, Any]) -> bytes:
    """The first attempt's body: the client's, asking for token ids."""
    upstream = dict(body)
    upstream["return_token_ids"] = True
    return dumps(upstream)


def dumps(document: object) -> bytes:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


class Verdict(Enum):
    FORWARD = "forward"
    """Send the (rewritten) event on."""
    DROP = "drop"
    """Not for the client (the continuation's role chunk)."""
    FAIL = "fail"
    """The attempt failed (abort, an in-band error): not forwarded; continue elsewhere."""
    STOP = "stop"
    """Forward it, then end the answer: the router matched a stop string in it."""


@dataclass(frozen=True)
class Seen:
    verdict: Verdict
    reason: str = ""


@dataclass
class Record:
    """One stream's migration state: what the client has received so far."""

    chat: bool
    body: dict[str, Any]
    """The request as the router received it (the gateway's changes included)."""
    refused: str | None
    """Why it cannot be continued (None: it can); set later by a tool call or reasoning."""
    client_ids: bool = False
    """The client asked for token ids itself (else the router's are removed)."""
    attempt: int = 0
    identity: dict[str, Any] = field(default_factory=dict)
    """`id`, `created`, `model`, `system_fingerprint` of the first attempt's first event."""
    prompt_ids: list[int] | None = None
    generated: list[int] = field(default_factory=list)
    """Ids of the events forwarded to the client, over all attempts."""
    base: int = 0
    """`len(generated)` when the current attempt started (its usage counts from there)."""
    events: int = 0
    """Data events forwarded to the client."""
    finished: str | None = None
    """The `finish_reason` forwarded (stop, length): the answer is complete."""
    prompt_tokens: int | None = None
    """The first attempt's usage `prompt_tokens` (`|P|` when no ids came)."""
    stops: Stops | None = None
    """The request's stop strings, matched here (only for a request that can be continued:
    the engines of any other one match them)."""
    stop_chunk: StopChunk | None = None
    """The event that completed a stop string carried several ids: some may be dropped
    (`keep_stop_ids`) once decoding said which completed it."""

    @classmethod
    def of(cls, path: str, body: dict[str, Any], settings: Settings) -> Record:
        refused = "migration is off" if settings.limit <= 0 else refusal(path, body)
        stops = Stops.of(body) if refused is None else None
        if stops is not None:
            body = {k: v for k, v in body.items() if k not in ROUTER_STOP_KEYS}
        return cls(
            chat=path == CHAT,
            body=body,
            refused=refused,
            client_ids=body.get("return_token_ids") is True,
            stops=stops,
        )

    @property
    def usage_wanted(self) -> bool:
        options = self.body.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    def next_attempt(self) -> None:
        """The next attempt starts; one before any event reached the client is a restart,
        still the first as far as the client can tell."""
        if self.events or self.generated:
            self.attempt += 1
        self.base = len(self.generated)

    # -- the events --------------------------------------------------------------------

    def see(self, doc: Any) -> Seen:
        """Record and rewrite (in place) one data event's JSON before it is forwarded."""
        if not isinstance(doc, dict):
            self.refused = self.refused or "an event that is not a JSON object"
            return Seen(Verdict.FORWARD)
        if "error" in doc and not doc.get("choices"):
            return Seen(Verdict.FAIL, "error")
        choices = doc.get("choices")
        choices = choices if isinstance(choices, list) else []
        for choice in choices:
            if isinstance(choice, dict) and choice.get("finish_reason") in ("abort", "error"):
                return Seen(Verdict.FAIL, str(choice["finish_reason"]))
        self._identity(doc)
        continuing = self.attempt > 0
        self._prompt_ids(doc, continuing)
        new: list[int] = []
        content = False
        stopped = False
        for choice in choices:
            if isinstance(choice, dict):
                content = self._choice(choice, continuing, new) or content
                stopped = stopped or self._stop(choice, len(self.generated) + len(new))
        usage = doc.get("usage")
        if isinstance(usage, dict):
            self._usage(usage)
        if continuing and self.chat and not new and not content and not isinstance(usage, dict):
            return Seen(Verdict.DROP)  # the continuation's role chunk
        self.generated.extend(new)
        if choices:
            self.events += 1
        return self._verdict(stopped, new)

    def _stop(self, choice: dict[str, Any], tokens: int) -> bool:
        """Match the router's stop strings on one choice's new text (rewritten in place to what
        the client gets now); whether one ends the answer here."""
        if self.stops is None:
            return False
        delta = choice.get("delta")
        holder: dict[str, Any] = choice
        key = "text"
        if self.chat:
            if not isinstance(delta, dict):
                return False
            holder, key = delta, "content"
        new = holder.get(key)
        finished = choice.get("finish_reason") is not None
        out, stop = self.stops.step(new if isinstance(new, str) else "", tokens, finished)
        if key in holder or out:
            holder[key] = out
        if stop is None:
            return False
        choice["finish_reason"] = "stop"
        choice["stop_reason"] = stop
        self.finished = "stop"
        return True

    def _verdict(self, stopped: bool, new: list[int]) -> Seen:
        """Forward the event, or (a stop string ended the answer in it, `new` its ids, the
        last of `generated`) stop there, noting a merged event's ids (`StopChunk`)."""
        if not stopped:
            return Seen(Verdict.FORWARD)
        if self.stops is not None and 1 < len(new) <= STOP_CHUNK_MAX_IDS:
            before = [*(self.prompt_ids or ()), *self.generated[: len(self.generated) - len(new)]]
            context = tuple(before[-DECODE_CONTEXT:])
            self.stop_chunk = StopChunk(tuple(new), context, self.stops.reach)
        return Seen(Verdict.STOP)

    def min_tokens_span(self, doc: Any) -> MinTokensSpan | None:
        """What to decode before `see` of the event `doc`, when its ids cross `min_tokens`
        with tokens before the crossing (`MinTokensSpan`); None for any other event, and for
        this one once its span is known (`past_min_tokens`)."""
        stops = self.stops
        if stops is None or stops.skip is not None or not isinstance(doc, dict):
            return None
        before = stops.min_tokens - len(self.generated)
        choices = doc.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        ids = choice.get("token_ids") if isinstance(choice, dict) else None
        if before <= 0 or not isinstance(ids, list) or not before < len(ids) <= STOP_CHUNK_MAX_IDS:
            return None
        if not all(isinstance(i, int) for i in ids):
            return None
        prompt = self.prompt_ids
        if prompt is None:  # the span is in the first event, which carries the prompt's ids
            holder = doc if self.chat else choice
            given = holder.get("prompt_token_ids") if isinstance(holder, dict) else None
            prompt = [i for i in given if isinstance(i, int)] if isinstance(given, list) else []
        context = [*prompt[-DECODE_CONTEXT:], *self.generated][-DECODE_CONTEXT:]
        return MinTokensSpan(tuple(ids[:before]), tuple(context))

    def past_min_tokens(self, skip: int) -> None:
        """The next event's stop search begins `skip` characters into its text."""
        if self.stops is not None:
            self.stops.skip = skip

    def keep_stop_ids(self, doc: dict[str, Any], kept: int) -> None:
        """Keep only the first `kept` ids of the event that completed a stop string (`doc`,
        as rewritten by `see`): in what was generated (so usage counts them) and in the ids
        the client asked for."""
        chunk, self.stop_chunk = self.stop_chunk, None
        if chunk is None or not 0 < kept < len(chunk.ids):
            return
        del self.generated[len(self.generated) - (len(chunk.ids) - kept) :]
        for choice in doc.get("choices") or ():
            if isinstance(choice, dict) and isinstance(choice.get("token_ids"), list):
                choice["token_ids"] = choice["token_ids"][:kept]

    def see_bytes(self, data: bytes) -> bytes | None:
        """`see` without parsing, for the bulk of a first attempt's events (`strip_ids`): the
        event's bytes to forward, or None when it needs `see`."""
        if self.attempt or self.client_ids or not self.identity or self.stops is not None:
            return None
        stripped = strip_ids(data)
        if stripped is None:
            return None
        forwarded, ids = stripped
        if ids is None:
            if self.refused is None:
                return None  # `see` decides whether text came without its ids
        else:
            self.generated.extend(ids)
        self.events += 1
        return forwarded

    def _prompt_ids(self, holder: dict[str, Any], continuing: bool) -> None:
        """The prompt's ids (chat: top level; completions: per choice), recorded from the first
        attempt; the client sees them once, and only when it asked."""
        ids = holder.get("prompt_token_ids")
        if isinstance(ids, list) and not continuing:
            self.prompt_ids = [int(i) for i in ids]
        if "prompt_token_ids" in holder and (continuing or not self.client_ids):
            holder["prompt_token_ids"] = None

    def _choice(self, choice: dict[str, Any], continuing: bool, new: list[int]) -> bool:
        """Record and rewrite one choice; its ids go to `new`. Whether it carries anything
        for the client (text, a finish)."""
        self._prompt_ids(choice, continuing)
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            new.extend(int(i) for i in ids)
        elif self.refused is None and _output(choice):
            # Text without its ids (an engine older than vLLM 0.10.2): nothing to carry.
            self.refused = "the engine sent no token ids"
        if "token_ids" in choice and not self.client_ids:
            choice["token_ids"] = None
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if any(delta.get(key) for key in ("tool_calls", "reasoning", "reasoning_content")):
                # A fresh parser on another engine would not know it is mid-call.
                self.refused = self.refused or "a tool call or reasoning is in progress"
            if continuing:
                delta.pop("role", None)
        if choice.get("finish_reason") is not None:
            self.finished = str(choice["finish_reason"])
            return True
        return _output(choice)

    def _identity(self, doc: dict[str, Any]) -> None:
        if not self.identity:
            for key in ("id", "created", "model", "system_fingerprint"):
                if key in doc:
                    self.identity[key] = doc[key]
            return
        for key, value in self.identity.items():
            if key in doc:
                doc[key] = value

    def _usage(self, usage: dict[str, Any]) -> None:
        prompt = usage.get("prompt_tokens")
        completion = usage.get("completion_tokens")
        if not isinstance(prompt, int) or not isinstance(completion, int):
            return
        if self.attempt == 0:
            self.prompt_tokens = prompt
            return
        first = self.prompt_tokens
        if first is None:
            first = len(self.prompt_ids) if self.prompt_ids is not None else prompt - self.base
        completion += self.base
        usage["prompt_tokens"] = first
        usage["completion_tokens"] = completion
        usage["total_tokens"] = first + completion
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            details["cached_tokens"] = min(details["cached_tokens"], first)

    # -- what comes next ----------------------------------------------------------------

    def continuation(self) -> dict[str, Any] | None:
        """The next attempt's body: the original before any token reached the client (a plain
        restart), else the continuation from `P + G`; None when no budget is left (the answer
        is complete at its length: `ending` then ends it)."""
        if not self.generated and self.events == 0:
            return dict(self.body)
        assert self.prompt_ids is not None
        body = dict(self.body)
        so_far = len(self.generated)
        context = [*self.prompt_ids, *self.generated]
        if self.chat:
            kv = body.get("kv_transfer_params")
            kv = dict(kv) if isinstance(kv, dict) else {}
            kv["prompt_token_ids"] = context
            body["kv_transfer_params"] = kv
            body.pop("echo", None)
            budgets = [k for k in ("max_completion_tokens", "max_tokens") if body.get(k)]
        else:
            for key in STRIPPED_FROM_COMPLETIONS:
                body.pop(key, None)
            body["prompt"] = context
            body.setdefault("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
            if body["max_tokens"] is None:
                body["max_tokens"] = COMPLETIONS_DEFAULT_MAX_TOKENS
            budgets = ["max_tokens"]
        for key in budgets:
            left = int(body[key]) - so_far
            if left < 1:
                return None
            body[key] = left
        if isinstance(body.get("min_tokens"), int):
            body["min_tokens"] = max(0, body["min_tokens"] - so_far)
        body["return_token_ids"] = True
        return body

    def ending(self, finish: str | None) -> bytes:
        """The end of an answer whose last events were lost: a `finish` chunk (when the
        answer had none yet), the usage the request asked for, `[DONE]`."""
        out = b""
        if finish is not None:
            ids: list[int] | None = [] if self.client_ids else None
            held = self.stops.flush() if self.stops is not None else ""
            choice: dict[str, Any]
            if self.chat:
                choice = {"index": 0, "delta": {"content": held} if held else {}, "logprobs": None}
                choice.update(finish_reason=finish, stop_reason=None, token_ids=ids)
            else:
                choice = {"index": 0, "text": held, "logprobs": None, "finish_reason": finish}
                choice.update(stop_reason=None, prompt_token_ids=None, token_ids=ids)
            out += self._event([choice])
        if self.usage_wanted:
            prompt = self.prompt_tokens
            if prompt is None:
                prompt = len(self.prompt_ids or ())
            completion = len(self.generated)
            usage = {
                "prompt_tokens": prompt,
                "total_tokens": prompt + completion,
                "completion_tokens": completion,
            }
            out += self._event([], usage=usage)
        return out + DONE

    def _event(self, choices: list[dict[str, Any]], **top: Any) -> bytes:
        doc: dict[str, Any] = {
            "id": self.identity.get("id", ""),
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.identity.get("created", 0),
            "model": self.identity.get("model", self.body.get("model")),
            "choices": choices,
            **top,
        }
        return b"data: " + dumps(doc) + b"\n\n"


IDS_KEY = b'"token_ids":['
ORDINARY = b'"finish_reason":null'
"""In every ordinary event of an engine writing compact JSON (vLLM's pydantic, the simulator):
an engine writing spaces never takes the byte path, so no spaced key can slip past a search."""
SLOW_MARKS = (
    b'"prompt_token_ids":[',
    b'"finish_reason":"',
    b'"usage":{',
    b'"error"',
    b'"tool_calls"',
    b'"reasoning',
)
"""Keys whose presence needs the whole event understood (`Record.see`). In valid JSON a key
pattern (quote, name, quote) can never match inside a string value, where every quote is
escaped, so a plain search is exact: a miss proves the key absent."""


def strip_ids(data: bytes) -> tuple[bytes, list[int] | None] | None:
    """The fast path of a first attempt's ordinary event (no finish, usage, error, tool call
    or reasoning; one choice): the bytes to forward, with the router-asked `token_ids` read
    (None when the event has none) and set to null, everything else as the engine sent it.
    None when the event needs `Record.see` (anything else)."""
    if b'"choices":[{' not in data or ORDINARY not in data:
        return None
    if any(mark in data for mark in SLOW_MARKS):
        return None
    at = data.find(IDS_KEY)
    if at < 0:
        return data, None
    if data.find(IDS_KEY, at + 1) >= 0:
        return None
    start = at + len(IDS_KEY)
    end = data.find(b"]", start)
    if end < 0:
        return None
    listed = data[start:end].strip()
    try:
        ids = [int(part) for part in listed.split(b",")] if listed else []
    except ValueError:
        return None
    return data[: start - 1] + b"null" + data[end + 1 :], ids


def _output(choice: dict[str, Any]) -> bool:
    """Whether a choice carries generated text (the chat role chunk does not)."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content"))
    return bool(choice.get("text"))


RERUN_PATHS = (COMPLETIONS, CHAT)
"""The non-streaming answers `cut_answer` judges (and the proxy reads whole to judge)."""
RERUN_BODY_LIMIT = 8 << 20
"""A non-streaming answer larger than this (or of unknown length) is relayed as it comes,
never held to be checked for a cut."""


def cut_answer(path: str, status: int, body: bytes) -> str | None:
    """Why a non-streaming completions or chat answer was cut mid-generation, so that re-running
    it from scratch on another replica is safe (none of it reached the client, and an engine
    keeps no state of a request it ended): "abort" (a 200 whose choice ended `abort`: a drain's
    or a shutdown's abort) or "error" (a 500: vLLM's generation error). None for a whole answer
    and for any other status (a 4xx is the request's own doing)."""
    if path not in RERUN_PATHS:
        return None
    if status == 500:
        return "error"
    if status != 200 or (b'"abort"' not in body and b'"error"' not in body):
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    choices = doc.get("choices") if isinstance(doc, dict) else None
    for choice in choices if isinstance(choices, list) else []:
        if isinstance(choice, dict) and choice.get("finish_reason") in ("abort", "error"):
            return str(choice["finish_reason"])
    return None


def error_document(message: str) -> bytes:
    """The OpenAI error object a stream that cannot go on ends with (as one `event: error`)."""
    return dumps(
        {
            "error": {
                "message": message,
                "type": "ServiceUnavailableError",
                "param": None,
                "code": 503,
            }
        }
    )
