"""Pure: a short, stable hash of a manifest fragment, used to detect drift of the pod template."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def template_hash(fragment: dict[str, Any]) -> str:
    """10 hex characters of the SHA-256 of the canonical JSON (sorted keys) of `fragment`."""
    canonical = json.dumps(fragment, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]
