"""The operator's hub probe (`llmop.hub`) against the stand-in: the real client's requests and
errors become the pre-flight's answers."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmop import hub as hub_io
from llmop.preflight import HubFacts, HubFailure
from support.hub_standin import HubRepo, HubStandin, synthetic_model


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandin]:
    model = synthetic_model(tmp_path_factory.mktemp("model"), weights_bytes=2 << 20)
    repos = [
        HubRepo("acme/open", model),
        HubRepo("acme/gated", model, gated=True, allowed_tokens=frozenset({"hf_ok"})),
    ]
    with HubStandin(repos, tokens=frozenset({"hf_other"})) as hub:
        yield hub


def probe(hub: HubStandin, repo: str, revision: str | None = None, token: str | None = None):
    return hub_io.probe(repo, revision, token=token, endpoint=hub.url, timeout=5)


def test_resolves_branch_and_sums_file_sizes(standin: HubStandin) -> None:
    repo = standin.repos["acme/open"]
    answer = probe(standin, "acme/open", "main")
    assert answer == HubFacts(sha=repo.sha, total_bytes=repo.total_bytes, gated=False)
    assert probe(standin, "acme/open", repo.sha) == answer


@pytest.mark.parametrize(
    ("repo", "revision", "token", "kind"),
    [
        ("acme/gated", None, None, "no_token"),
        ("acme/gated", None, "hf_other", "access_denied"),
        ("acme/gated", None, "hf_unknown", "invalid_token"),
        ("acme/missing", None, None, "repo_not_found"),
        ("acme/open", "no-such-branch", None, "revision_not_found"),
    ],
)
def test_refusals(
    standin: HubStandin, repo: str, revision: str | None, token: str | None, kind: str
) -> None:
    answer = probe(standin, repo, revision, token)
    assert isinstance(answer, HubFailure)
    assert answer.kind == kind


def test_gated_with_access(standin: HubStandin) -> None:
    answer = probe(standin, "acme/gated", token="hf_ok")
    assert isinstance(answer, HubFacts)
    assert answer.gated


def test_unreachable(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    answer = hub_io.probe(
        "acme/open", None, token=None, endpoint=f"http://127.0.0.1:{port}", timeout=2
    )
    assert isinstance(answer, HubFailure)
    assert answer.kind == "unreachable"
