"""Where kopf keeps what it remembers about an LLMDeployment between events.

kopf's stock diff-base storage writes the last handled spec onto the user's object as an
annotation: one PATCH of every created or changed LLMDeployment, and one more watch event for the
operator to decode, which at a 1,000-CR burst was about one write in six that the API server
served. llmop's reconcile is level-based (the same function for create, update and resume, and a
run that finds everything in place writes nothing), so the diff base only has to tell "the spec,
labels or annotations changed since last handled" from "our own status write" within one
operator process. `ProcessDiffBase` keeps it in memory. After a restart (or a peering
take-over) every object is handled once again, as kopf's resume did, and writes nothing when
it is in sync.

A retrying handler's progress (retry count, backoff) still goes into annotations, where it
survives a restart. `QuietProgressStorage` only stops kopf from writing its "kopf-managed"
marker annotation by itself: the marker brands progress records, so it goes with one.
"""

from __future__ import annotations

import json
from typing import Any

import kopf

from llmop.api.v1alpha1 import KIND

MARKER_SUFFIX = "kopf-managed"
"""kopf's name for the annotation that brands a prefix as a kopf storage's
(`kopf._cogs.configs.conventions.StorageKeyMarkingConvention`)."""


class ProcessDiffBase(kopf.DiffBaseStorage):
    """The last handled essence of each object, by uid, as compact JSON text (about 0.5 KiB
    per LLMDeployment), in this process only."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self._essences: dict[str, str] = {}

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        if body.get("kind", KIND) != KIND:
            # kopf builds an essence for every watch event of every kind, children included,
            # though only the LLMDeployment has change handlers to compare it for: at a
            # 1,000-CR burst most events are Deployment and Service events, each spec deep-
            # copied twice for nothing. No essence is no change, and no change is asked for.
            return None
        source: Any = body
        if not extra_fields:
            # kopf's build deep-copies the whole body, managedFields and status included, only
            # to drop all but the spec, labels and annotations: at a 1,000-CR burst a tenth of
            # the operator's CPU. Hand it those alone (extra fields, which no llmop handler
            # asks for, would be picked from the rest of the body).
            metadata = body.get("metadata") or {}
            source = {k: v for k, v in body.items() if k not in ("metadata", "status")}
            kept = ("labels", "annotations")
            source["metadata"] = {k: metadata[k] for k in kept if k in metadata}
        essence = super().build(body=source, extra_fields=extra_fields)
        # kopf drops the annotations of prefixes that carry its marker. Ours may carry none now
        # (see QuietProgressStorage), and a retry record coming and going is no change to act on.
        annotations = essence.get("metadata", {}).get("annotations")
        if annotations:
            for key in [k for k in annotations if k.startswith(f"{self.prefix}/")]:
                del annotations[key]
            self.remove_empty_stanzas(essence)
        return essence

    def fetch(self, *, body: kopf.Body) -> Any:
        text = self._essences.get(body.metadata.uid or "")
        return None if text is None else json.loads(text)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        uid = body.metadata.uid
        if uid:
            self._essences[uid] = json.dumps(essence, separators=(",", ":"), sort_keys=True)

    def forget(self, uid: str) -> None:
        """The object is gone: drop its essence (kopf calls `store` only while it exists)."""
        self._essences.pop(uid, None)

    def __len__(self) -> int:
        return len(self._essences)


class QuietProgressStorage(kopf.AnnotationsProgressStorage):
    """kopf's annotation progress storage, minus the marker annotation on an object where no
    progress record is written: a handler that succeeds at once leaves the object untouched."""

    def purge(self, *, key: Any, body: kopf.Body, patch: kopf.Patch) -> None:
        super().purge(key=key, body=body, patch=patch)
        annotations = patch.get("metadata", {}).get("annotations", {})
        marker = f"{self.prefix}/{MARKER_SUFFIX}"
        if set(annotations) == {marker} and marker not in body.metadata.annotations:
            del annotations[marker]
            if not annotations:
                del patch["metadata"]["annotations"]
            if not patch["metadata"]:
                del patch["metadata"]
