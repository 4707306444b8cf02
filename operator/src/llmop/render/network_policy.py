"""Pure: the NetworkPolicy that fences one LLMDeployment's engine pods (chart value
`networkPolicy.enabled`, operator setting `LLMOP_NETWORK_POLICY`).

Engine pods live in the CRs' namespaces, which a chart-time policy cannot know in a cluster-wide
install, so the operator renders one policy per CR beside its Service. Who may connect comes from
the chart (the router's and the operator's pods, Prometheus, extra peers) as NetworkPolicyPeer
lists; the CR's own namespace and the CR's own pods are added here:

- the API port (`http`, where vLLM also serves its LoRA and the simulator its fault routes): the
  router, pods of the CR's own namespace, Prometheus (vLLM's `/metrics`) and the extra API peers;
- the agent's port (`probe`: probes, `/status`, `/metrics`): the operator, the router (it asks a
  waking CR's starting pods `/readyz` itself), Prometheus and the extra probe peers. Kubelet
  probes come from the pod's own node, which NetworkPolicy always admits ("traffic to and from
  the node where a Pod is running is always allowed",
  https://kubernetes.io/docs/concepts/services-networking/network-policies/); a CNI that does
  not follows the extra probe peers (the node CIDR as an ipBlock);
- every port between the CR's own pods: a multi-node replica's leader and workers rendezvous
  on torch's and NCCL's ports.
"""

from __future__ import annotations

from typing import Any

from llmop import kinds, names
from llmop.api.v1alpha1 import LLMDeployment
from llmop.render.metadata import child_metadata
from llmop.settings import API_PEERS, PROBE_PEERS, parse_peers


def render_network_policy(llmd: LLMDeployment, peers_json: str) -> dict[str, Any]:
    """The CR's NetworkPolicy; `peers_json` is the operator's validated setting."""
    peers = parse_peers(peers_json)
    own_pods = {"podSelector": {"matchLabels": names.selector_labels(llmd.metadata.name)}}
    same_namespace: dict[str, Any] = {"podSelector": {}}

    def port(name: str) -> list[dict[str, Any]]:
        # By name: the API port follows spec.service.port without a second number here.
        return [{"protocol": "TCP", "port": name}]

    ingress: list[dict[str, Any]] = [
        {"from": [same_namespace, *peers[API_PEERS]], "ports": port(names.API_PORT_NAME)}
    ]
    # A rule with an empty `from` admits every source: no probe peers, no rule (the node's own
    # probes stay admitted).
    if peers[PROBE_PEERS]:
        ingress.append({"from": peers[PROBE_PEERS], "ports": port(names.PROBE_PORT_NAME)})
    ingress.append({"from": [own_pods]})
    return {
        "apiVersion": kinds.NETWORK_POLICY.api_version,
        "kind": kinds.NETWORK_POLICY.kind,
        "metadata": child_metadata(llmd),
        "spec": {
            "podSelector": {"matchLabels": names.selector_labels(llmd.metadata.name)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
