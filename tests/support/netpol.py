"""A small, pure evaluator of Kubernetes NetworkPolicy ingress semantics (networking.k8s.io/v1),
for proving llmop's policies where no CNI enforces them (kube-proxy alone does not).

It follows https://kubernetes.io/docs/concepts/services-networking/network-policies/: a pod
selected by no Ingress policy admits everything; a selected pod admits a connection when some
rule of some selecting policy admits both its source (`from`: pods by podSelector in the policy's
namespace, pods of namespaces by namespaceSelector, both in one peer meaning AND, ipBlock by
address; absent or empty: every source) and its port (`ports`: number or the destination
container's named port, protocol TCP by default, `endPort` ranges; absent or empty: every
port); and traffic from the pod's own node is always admitted. Egress is not modelled (llmop
renders none). Tests check it on the documentation's own examples first.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Pod:
    """A pod as policies see it: namespace, labels, IP, node and named container ports."""

    name: str
    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    ip: str = "10.244.0.1"
    node: str = "node-1"
    ports: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Node:
    """A connection's source that is a node (the kubelet's probes)."""

    name: str
    ip: str = "10.0.0.1"


@dataclass(frozen=True)
class External:
    """A source outside the pod network, by address."""

    ip: str


Source = Pod | Node | External


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector (matchLabels AND matchExpressions); an empty one matches everything."""
    if selector is None:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def _is_ingress(policy: Mapping[str, Any]) -> bool:
    spec = policy["spec"]
    types = spec.get("policyTypes")
    if types is None:  # the API's default: Ingress always, Egress when egress rules exist
        return True
    return "Ingress" in types


def _peer_admits(
    peer: Mapping[str, Any],
    policy_namespace: str,
    source: Source,
    namespaces: Mapping[str, Mapping[str, str]],
) -> bool:
    block = peer.get("ipBlock")
    if block is not None:
        if isinstance(source, Node):
            return False  # the node is admitted by the rule below, not by address
        address = ipaddress.ip_address(source.ip)
        if address not in ipaddress.ip_network(block["cidr"]):
            return False
        return not any(address in ipaddress.ip_network(cidr) for cidr in block.get("except", []))
    if not isinstance(source, Pod):
        return False  # selectors select pods only
    if "namespaceSelector" in peer:
        ns_labels = namespaces[source.namespace]
        if not selector_matches(peer["namespaceSelector"], ns_labels):
            return False
    elif source.namespace != policy_namespace:
        return False  # a podSelector alone selects in the policy's own namespace
    return selector_matches(peer.get("podSelector"), source.labels)


def _port_admits(rule_ports: Sequence[Mapping[str, Any]] | None, dest: Pod, port: int) -> bool:
    if not rule_ports:
        return True
    for entry in rule_ports:
        if entry.get("protocol", "TCP") != "TCP":
            continue
        wanted = entry.get("port")
        if wanted is None:
            return True
        if isinstance(wanted, str):
            # A named port admits the number the destination pod gives that name (none: no match).
            if dest.ports.get(wanted) == port:
                return True
            continue
        end = entry.get("endPort", wanted)
        if wanted <= port <= end:
            return True
    return False


def admitted(
    policies: Iterable[Mapping[str, Any]],
    namespaces: Mapping[str, Mapping[str, str]],
    source: Source,
    dest: Pod,
    port: int,
) -> bool:
    """Whether `dest` admits a TCP connection from `source` to `port` under `policies`.
    `namespaces`: every namespace's labels."""
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == dest.namespace
        and _is_ingress(p)
        and selector_matches(p["spec"].get("podSelector"), dest.labels)
    ]
    if not selecting:
        return True
    if isinstance(source, Node) and source.name == dest.node:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            if not _port_admits(rule.get("ports"), dest, port):
                continue
            peers = rule.get("from")
            if not peers:
                return True
            if any(
                _peer_admits(peer, policy["metadata"]["namespace"], source, namespaces)
                for peer in peers
            ):
                return True
    return False
