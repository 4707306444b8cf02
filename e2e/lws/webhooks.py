"""Render the LWS controller's webhook configurations for a manager running as a host process.

The module's kustomize base (`config/webhook/manifests.yaml` plus `mutating-patch.yaml` and
`validating-patch.yaml`, copied next to the binary by e2e/cluster/build-lws.sh) names a Service
in the controller's namespace; a host process has none, so each webhook gets
`clientConfig.url: https://127.0.0.1:<port><path>` and the CA that signed the serving cert
instead. Everything else (names, paths, rules, the pod webhooks' objectSelector, failurePolicy)
is taken from the module as is, so a version bump brings its own webhooks along.

Usage: webhooks.py <config dir> <port> <ca.crt>   prints a JSON List for `kubectl apply -f -`
"""

from __future__ import annotations

import base64
import json
import pathlib
import sys
from typing import Any

import yaml

# kustomize's namePrefix in the module's config/default (the release manifests' names).
NAME_PREFIX = "lws-"
PATCHES = {
    "MutatingWebhookConfiguration": "mutating-patch.yaml",
    "ValidatingWebhookConfiguration": "validating-patch.yaml",
}


def apply_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    """The JSON patch ops kustomize applies here: `replace` of one `/webhooks/<i>` entry."""
    for op in ops:
        parts = op["path"].strip("/").split("/")
        if op["op"] != "replace" or len(parts) != 2 or parts[0] != "webhooks":
            raise ValueError(f"unsupported webhook patch {op['op']} {op['path']}")
        doc["webhooks"][int(parts[1])] = op["value"]


def render(config_dir: pathlib.Path, port: int, ca_pem: bytes) -> dict[str, Any]:
    ca_bundle = base64.b64encode(ca_pem).decode()
    items = []
    for doc in yaml.safe_load_all((config_dir / "manifests.yaml").read_text()):
        if not doc:
            continue
        apply_patch(doc, yaml.safe_load((config_dir / PATCHES[doc["kind"]]).read_text()))
        doc["metadata"]["name"] = NAME_PREFIX + doc["metadata"]["name"]
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
        items.append(doc)
    return {"apiVersion": "v1", "kind": "List", "items": items}


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    out = render(pathlib.Path(argv[1]), int(argv[2]), pathlib.Path(argv[3]).read_bytes())
    json.dump(out, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
