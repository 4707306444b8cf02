"""What one request generates, decided when it is submitted: ids, streamed text, finish.

The simulated model is deterministic (`tokens`), so a request's whole output is known up front:
`plan` runs the model to `max_tokens` and applies vLLM's stop rules as its engine and detokenizer
do (vLLM 0.32, `v1/core/sched/utils.py::check_stop`, `v1/engine/detokenizer.py`):

- `stop_token_ids`: the request stops on such an id, finish "stop", `stop_reason` the id; its text
  is left out unless `include_stop_str_in_output`. Before `min_tokens` the ids are masked out of
  the pick (vLLM's min-tokens logits processor), so another word comes instead.
- `stop` strings: checked on the output text once more than `min_tokens` tokens exist, over the
  new token's text and the `len(stop) - 1` characters before it (so a stop string spanning two
  tokens matches); the earliest-ending match wins. The text is cut before the stop string (or
  after it with `include_stop_str_in_output`), finish "stop", `stop_reason` the string. The token
  that completed it is the last id.
- End of sequence: with `--sim-eos-probability P` the model ends its answer at a position with
  chance P (decided by the context's hash, so a continuation ends where the run would have),
  not before `min_tokens` and never with `ignore_eos`: the EOS id (2) is the last id, its text
  empty, finish "stop", `stop_reason` null. With P = 0 (the default) answers run to a limit.
- While streaming with `stop` strings and without `include_stop_str_in_output`, the last
  `max(len(stop)) - 1` characters are held back (they may start a stop string): the text of a
  chunk lags its ids, and a finish flushes it (a finish by length, stop, or an abort: vLLM's abort
  output goes through the same detokenizer with `finished=True`).

The engine (`batching`) only counts tokens; the server streams `Plan.texts` and `Plan.ids`.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmop_engine.simulator import tokens


@dataclass(frozen=True)
class SamplingSpec:
    """The request fields that decide the output (vLLM's SamplingParams, those modelled)."""

    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    include_stop_str_in_output: bool = False
    min_tokens: int = 0
    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False

    @classmethod
    def from_body(cls, body: Mapping[str, object]) -> SamplingSpec:
        """From a completions or chat body; ValueError for what vLLM answers 400."""
        raw_stop = body.get("stop")
        if raw_stop is None:
            stop: tuple[str, ...] = ()
        elif isinstance(raw_stop, str):
            stop = (raw_stop,)
        elif isinstance(raw_stop, list) and all(isinstance(s, str) for s in raw_stop):
            stop = tuple(raw_stop)
        else:
            raise ValueError("stop must be a string or a list of strings")
        stop = tuple(s for s in stop if s)  # vLLM drops empty stop strings
        raw_ids = body.get("stop_token_ids") or []
        if not isinstance(raw_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in raw_ids
        ):
            raise ValueError("stop_token_ids must be a list of integers")
        min_tokens = _int(body.get("min_tokens"), "min_tokens", 0)
        if min_tokens < 0:
            raise ValueError(f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
        temperature = body.get("temperature")
        if temperature is not None and not isinstance(temperature, int | float):
            raise ValueError("temperature must be a number")
        seed = body.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise ValueError("seed must be an integer")
        return cls(
            stop=stop,
            stop_token_ids=frozenset(raw_ids),
            include_stop_str_in_output=bool(body.get("include_stop_str_in_output")),
            min_tokens=min_tokens,
            # The simulated model's generation config says greedy: an omitted temperature is 0.
            temperature=float(temperature or 0.0),
            seed=seed,
            ignore_eos=bool(body.get("ignore_eos")),
        )

    @property
    def hold_back(self) -> int:
        """Characters withheld while streaming (vLLM's `stop_buffer_length`)."""
        if self.stop and not self.include_stop_str_in_output:
            return max(len(s) for s in self.stop) - 1
        return 0


def _int(value: object, name: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer")
    return value


@dataclass(frozen=True)
class Plan:
    """A request's output if nothing cuts it: `ids[i]` streams with `texts[i]`; a finish (abort)
    after `k` tokens flushes `pending[k - 1]`."""

    ids: tuple[int, ...]
    texts: tuple[str, ...]
    pending: tuple[str, ...]
    finish: str
    """"length" or "stop": the reason the last id carries."""
    stop_reason: str | int | None

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def flush(self, produced: int) -> str:
        """Held-back text an abort after `produced` tokens sends with its finish chunk."""
        return self.pending[produced - 1] if produced else ""


def check_stop_strings(
    output_text: str, new_chars: int, stop: Sequence[str], include: bool
) -> tuple[str, int] | None:
    """vLLM's `check_stop_strings`: (stop string, offset to truncate to, -1 for none) for the
    stop string completing earliest in the new text, ties by list order."""
    if not new_chars or not stop:
        return None
    best: str | None = None
    best_index, best_end = 0, sys.maxsize
    for candidate in stop:
        index = output_text.find(candidate, 1 - new_chars - len(candidate))
        if index != -1 and index + len(candidate) < best_end:
            best, best_index, best_end = candidate, index, index + len(candidate)
    if best is None:
        return None
    if include:
        return best, (-1 if best_end >= len(output_text) else best_end)
    return best, best_index


def plan(
    context: Sequence[int],
    max_tokens: int,
    spec: SamplingSpec,
    shift: int = 0,
    eos_probability: float = 0.0,
) -> Plan:
    """Run the model from `context` for up to `max_tokens` ids under `spec`'s stop rules.
    `eos_probability`: the chance the model ends its answer at each position (the simulator's
    `--sim-eos-probability`, 0 by default: it then always runs to a limit)."""
    state = tokens.context_hash(context)
    salt = _salt(spec)
    eos = 0.0 if spec.ignore_eos else eos_probability
    if not spec.stop and not spec.stop_token_ids and not eos:
        run = tokens.run(state, max_tokens, salt=salt, shift=shift)
        words = tuple(tokens.word_text(t) for t in run)
        return Plan(tuple(run), words, ("",) * len(run), "length", None)
    hold = spec.hold_back
    ids: list[int] = []
    texts: list[str] = []
    pending: list[str] = []
    output = ""
    emitted = 0
    finish = "length"
    reason: str | int | None = None
    for position in range(max_tokens):
        banned = spec.stop_token_ids if position < spec.min_tokens else frozenset()
        draw = tokens.sample_draw(salt, position) if salt is not None else 0
        token = tokens.next_id(state, draw=draw, shift=shift, banned=banned)
        if eos and position >= spec.min_tokens and tokens.ends(state ^ draw, eos):
            token = tokens.EOS
        state = tokens.absorb(state, token)
        ids.append(token)
        output, stopped = _apply_stops(spec, token, output, len(ids))
        if stopped is not None:
            finish, reason = "stop", stopped[0]
        done = finish == "stop" or position + 1 == max_tokens
        # vLLM's get_next_output_text: everything once finished, else all but the held-back tail.
        upto = len(output) if done else max(emitted, len(output) - hold)
        texts.append(output[emitted:upto])
        emitted = upto
        pending.append(output[emitted:])
        if finish == "stop":
            break
    return Plan(tuple(ids), tuple(texts), tuple(pending), finish, reason)


def _apply_stops(
    spec: SamplingSpec, token: int, output: str, produced: int
) -> tuple[str, tuple[str | int | None] | None]:
    """The output text with `token` added, and `(stop_reason,)` when it ends the answer."""
    before = len(output)
    stop_id = token in spec.stop_token_ids
    if not stop_id or spec.include_stop_str_in_output:
        output += tokens.word_text(token)  # "" for EOS, a special token vLLM skips
    stopped: tuple[str | int | None] | None = None
    if stop_id:
        stopped = (token,)
    elif token == tokens.EOS:
        stopped = (None,)  # vLLM: finish "stop", stop_reason None
    if spec.stop and produced > spec.min_tokens:
        found = check_stop_strings(
            output, len(output) - before, spec.stop, spec.include_stop_str_in_output
        )
        if found is not None:
            stopped = (found[0],)
            if found[1] != -1:
                output = output[: found[1]]
    return output, stopped


def _salt(spec: SamplingSpec) -> int | None:
    """The sampler's generator: None for greedy, the seed, or fresh randomness per request."""
    if spec.temperature <= 0:
        return None
    if spec.seed is not None:
        return spec.seed & ((1 << 64) - 1)
    return random.getrandbits(64)
