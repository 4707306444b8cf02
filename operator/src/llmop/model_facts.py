"""Pure: planning a model outside the catalog from its own files — which files to read, what the
Hub's answer means, and what the plan may do meanwhile.

A spec whose model is neither in the planner's catalog nor described by
`spec.model.architecture` is planned from the model's `config.json` and safetensors index at
its revision (`request_for` says which, and whether the plan could use them at all). The files
are read away from the reconcile (`llmop.facts_check`, through `llmop.hub`); `answer_of` turns
what the Hub returned into an `Answer`, and `verdict` turns the answer known now into what the
plan gets (`sizing.FactsVerdict`):

- `Read` (the facts, and the commit they were read at): plan with them, exactly as
  `llmop plan` does;
- nothing yet: wait (`ReadingModelFiles`): no pod is created until the plan is made;
- `Unavailable` (the Hub did not answer: network, 5xx, rate limit): wait
  (`ModelFilesUnavailable`, naming the model, the revision and the error) and try again with
  backoff (`retry_after`). A CR this process planned before keeps its facts in memory, so an
  outage never reaches it; files an earlier process read are recorded
  (`llmop.model_files_record`, used by `llmop.facts_check` in place of the Hub's answer); one
  whose files were never recorded keeps its running engines and its last `status.plan`
  (`held`) until the files are read again;
- `Refused` (no such model or revision, a gated model without access, no `config.json`, a
  layer type, dtype or quantization the planner cannot size): stall, the message naming the
  file, the field and the fix.

The simulator loads no weights, so for it the files only sharpen the simulated KV cache: a Hub
that cannot tell is no reason to wait or stall (`tolerant`), it is planned as before without
them.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmop import preflight
from llmop.api.v1alpha1 import LLMDeployment, PlanStatus
from llmop.cpu_engine import cpu_engine
from llmop.planner import ModelArchitecture, lookup_model
from llmop.planner.model_config import (
    CONFIG_FILE,
    INDEX_FILE,
    ModelConfigError,
    ModelFiles,
    facts_from_files,
)
from llmop.preflight import HubFailure
from llmop.sizing import REASON_MODEL_UNKNOWN, FactsVerdict, gpu_memory_for, plan_for

REASON_READING_MODEL_FILES = "ReadingModelFiles"
REASON_MODEL_FILES_UNAVAILABLE = "ModelFilesUnavailable"
REASON_MODEL_CONFIG_UNSUPPORTED = "ModelConfigUnsupported"

RETRY_FIRST_SECONDS = 5.0
"""After the Hub first fails to answer, the files are asked for again this much later..."""
RETRY_LONGEST_SECONDS = 300.0
"""...doubling each time up to this."""

FIX_BY_HAND = "set spec.model.architecture to plan it without the Hub"


@dataclass(frozen=True)
class FactsRequest:
    """The files one spec needs read: the model at its revision, with the token of the
    spec's `tokenSecretRef` (the Secret's namespace, name and key; the namespace is empty
    without one, so specs of one public model in many namespaces ask once)."""

    model: str
    revision: str | None
    namespace: str = ""
    token_secret: tuple[str, str] | None = None

    @property
    def at(self) -> str:
        """`model@revision`, for messages."""
        return f"{self.model}@{self.revision or 'main'}"

    @property
    def token_name(self) -> str | None:
        """`name/key` of the token Secret, as the pre-flight's messages name it."""
        return None if self.token_secret is None else "/".join(self.token_secret)

    @property
    def files(self) -> tuple[str, str]:
        """What the facts of (model, revision) are cached by: any token reads the same files."""
        return self.model, self.revision or "main"


@dataclass(frozen=True)
class Read:
    """The facts read from the model's files, and the commit they were read at."""

    facts: ModelArchitecture
    commit: str | None


@dataclass(frozen=True)
class Refused:
    """The model cannot be planned from its files as the spec names them."""

    reason: str
    message: str


@dataclass(frozen=True)
class Unavailable:
    """The Hub did not answer (`detail`: its error); asked again after `retry_in` seconds."""

    detail: str
    attempts: int
    retry_in: float


Answer = Read | Refused | Unavailable


def request_for(llmd: LLMDeployment) -> FactsRequest | None:
    """The files to read before `llmd` can be planned; None when its plan needs none: the
    facts come from spec.model.architecture or the catalog, the weights are on a volume
    (`pvc://`), or the plan could not use them (no GPUs on the simulator, GPU memory or the
    CPU engine's memory unknown)."""
    spec = llmd.spec
    model = spec.model
    if model.architecture is not None or "://" in model.name or lookup_model(model.name):
        return None
    if plan_for(spec).reason != REASON_MODEL_UNKNOWN:
        return None
    if not cpu_engine(spec) and gpu_memory_for(spec) is None:
        return None  # it would only say GPUMemoryUnknown with the facts too
    ref = model.token_secret_ref
    if ref is None:
        return FactsRequest(model.name, model.revision)
    namespace = llmd.metadata.namespace or ""
    return FactsRequest(model.name, model.revision, namespace, (ref.name, ref.key))


def retry_after(attempts: int) -> float:
    """Seconds until the files are asked for again after `attempts` unanswered tries."""
    return min(RETRY_LONGEST_SECONDS, RETRY_FIRST_SECONDS * float(2 ** max(0, attempts - 1)))


def answer_of(request: FactsRequest, found: ModelFiles | HubFailure, *, attempts: int) -> Answer:
    """What `found` (the files as `llmop.hub.model_files` read them, or its failure) means for
    `request`, after `attempts` tries in a row (this one included)."""
    if isinstance(found, HubFailure):
        judged = preflight.verdict(
            model=request.model,
            revision=request.revision,
            token_secret=request.token_name,
            answer=found,
            cache_bytes=None,
        )
        if judged.retry:
            return Unavailable(found.detail or found.kind, attempts, retry_after(attempts))
        return Refused(
            judged.reason or preflight.REASON_MODEL_NOT_FOUND,
            f"The planner reads {CONFIG_FILE} of {request.at} to size it: {judged.message}; "
            f"or {FIX_BY_HAND}",
        )
    try:
        facts = facts_from_files(found, name=request.model, source="hub")
    except ModelConfigError as error:
        at = f"{request.model}@{found.revision[:12]}" if found.revision else request.at
        return Refused(REASON_MODEL_CONFIG_UNSUPPORTED, f"{at}: {error}")
    return Read(facts, found.revision)


def verdict(
    request: FactsRequest,
    answer: Answer | None,
    *,
    tolerant: bool = False,
    held: PlanStatus | None = None,
) -> FactsVerdict:
    """What the plan of a spec needing `request` gets, from the `answer` known now (None: not
    read yet). `tolerant`: the engine needs no weights (the simulator), so only a read in
    flight is waited for. `held`: status.plan as last written from these files for this
    generation (a restart lost the facts), kept while the plan waits."""
    if isinstance(answer, Read):
        return FactsVerdict(architecture=answer.facts, revision=answer.commit)
    if isinstance(answer, Refused):
        if tolerant:
            return FactsVerdict(message=f"Its files were not used: {answer.message}")
        return FactsVerdict("refuse", reason=answer.reason, message=answer.message)
    if answer is None:
        return FactsVerdict(
            "wait",
            reason=REASON_READING_MODEL_FILES,
            message=(
                f"Reading {CONFIG_FILE} and {INDEX_FILE} of {request.at} from the Hub to plan "
                "its capacity; no engine pod is created before the plan."
            ),
            held=held,
        )
    if tolerant:
        return FactsVerdict(message=f"The Hub did not answer for {request.at}: {answer.detail}.")
    kept = (
        "the running engines and the last status.plan are kept as they are"
        if held is not None
        else "no engine pod is created before the plan"
    )
    return FactsVerdict(
        "wait",
        reason=REASON_MODEL_FILES_UNAVAILABLE,
        message=(
            f"Cannot read {CONFIG_FILE} of {request.at} to plan its capacity: the Hub did not "
            f"answer ({answer.detail}); {kept}. Trying again with backoff (attempt "
            f"{answer.attempts}, next in {answer.retry_in:g} s); or {FIX_BY_HAND}."
        ),
        held=held,
    )
