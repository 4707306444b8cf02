"""`llmop.kube` on the wire, against a local stand-in of the API server: what each request
carries, TLS both ways, and credentials renewed on 401 and by age. (The gateway's verbs against a
real kube-apiserver: tests/integration.)"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from llmop import kube as kube_module
from llmop.credentials import Credentials
from llmop.kube import Kube, KubeError


@dataclass
class Seen:
    """What the stand-in received, and which bearer tokens it accepts."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    accepted: set[str] | None = None
    release: threading.Event = field(default_factory=threading.Event)
    """What a request for an object named `hang` waits for before it is answered."""


def _serve(seen: Seen, context: ssl.SSLContext | None = None) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            seen.requests.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": dict(self.headers.items()),
                    "body": json.loads(body) if body else None,
                }
            )
            token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
            if self.path.endswith("/hang"):
                seen.release.wait(30)
            if seen.accepted is not None and token not in seen.accepted:
                self._send(401, {"kind": "Status", "message": "Unauthorized"})
            elif self.path.startswith("/api/v1/namespaces/ns/configmaps/absent"):
                self._send(404, {"kind": "Status", "message": "not found"})
            else:
                self._send(200, {"kind": "ConfigMap", "metadata": {"name": "x"}})

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = do_POST = do_DELETE = do_PUT = _answer  # noqa: N815

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    scheme = "https" if context is not None else "http"
    try:
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}"
    finally:
        seen.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def seen() -> Seen:
    return Seen()


@pytest.fixture
def plain_server(seen: Seen) -> Iterator[str]:
    yield from _serve(seen)


def test_requests_carry_the_token_the_agent_and_compact_json(plain_server: str, seen: Seen) -> None:
    kube = Kube(Credentials(server=plain_server, token="secret"))
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "namespace": "ns"},
        "data": {"k": "v w"},
    }
    assert kube.apply(manifest, field_manager="llmop") == {
        "kind": "ConfigMap",
        "metadata": {"name": "x"},
    }
    assert kube.read("v1", "ConfigMap", "ns", "absent") is None
    apply, read = seen.requests
    assert apply["method"] == "PATCH"
    assert apply["path"] == "/api/v1/namespaces/ns/configmaps/x?fieldManager=llmop&force=true"
    assert apply["headers"]["Authorization"] == "Bearer secret"
    assert apply["headers"]["User-Agent"] == "llmop"
    assert apply["headers"]["Content-Type"] == "application/apply-patch+yaml"
    assert apply["body"] == manifest
    assert read["method"] == "GET"
    assert "Content-Type" not in read["headers"]
    kube.close()


def test_a_server_url_with_a_path_keeps_it_in_front_of_every_request(
    plain_server: str, seen: Seen
) -> None:
    kube = Kube(Credentials(server=f"{plain_server}/k8s/clusters/c-1/", token="t"))
    kube.read("v1", "ConfigMap", "ns", "x")
    assert seen.requests[0]["path"] == "/k8s/clusters/c-1/api/v1/namespaces/ns/configmaps/x"


def test_basic_auth_when_the_kubeconfig_has_a_username(plain_server: str, seen: Seen) -> None:
    Kube(Credentials(server=plain_server, username="admin", password="pw")).read(
        "v1", "ConfigMap", "ns", "x"
    )
    assert seen.requests[0]["headers"]["Authorization"] == "Basic YWRtaW46cHc="


def test_a_refused_token_is_renewed_once_through_the_exec_plugin(
    plain_server: str, seen: Seen, tmp_path: Path
) -> None:
    counter = tmp_path / "runs"
    plugin = tmp_path / "plugin"
    plugin.write_text(
        f"#!{sys.executable}\nimport json, pathlib\n"
        f"p = pathlib.Path({str(counter)!r})\n"
        "n = int(p.read_text()) + 1 if p.exists() else 1\np.write_text(str(n))\n"
        "print(json.dumps({'kind': 'ExecCredential', 'status': {'token': f'token-{n}'}}))\n"
    )
    plugin.chmod(0o755)
    config = tmp_path / "config"
    config.write_text(
        yaml.safe_dump(
            {
                "current-context": "c",
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                "clusters": [{"name": "k", "cluster": {"server": plain_server}}],
                "users": [{"name": "u", "user": {"exec": {"command": str(plugin)}}}],
            }
        )
    )
    kube = Kube.connect(kubeconfig=config)
    seen.accepted = {"token-2"}  # the first token has been revoked meanwhile
    assert kube.read("v1", "ConfigMap", "ns", "x") is not None
    assert [r["headers"]["Authorization"] for r in seen.requests] == [
        "Bearer token-1",
        "Bearer token-2",
    ]
    seen.accepted = set()  # refused again, and again after renewal: an error, no loop
    with pytest.raises(KubeError, match="401"):
        kube.read("v1", "ConfigMap", "ns", "x")
    assert counter.read_text() == "3"


def test_a_token_file_is_read_again_once_a_minute(
    plain_server: str, seen: Seen, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("old")
    kube = Kube(Credentials(server=plain_server, token_file=str(token), renewable=True))
    token.write_text("rotated")
    kube.read("v1", "ConfigMap", "ns", "x")
    monkeypatch.setattr(kube_module, "TOKEN_FILE_RELOAD_SECONDS", 0.0)
    kube.read("v1", "ConfigMap", "ns", "x")
    assert [r["headers"]["Authorization"] for r in seen.requests] == [
        "Bearer old",
        "Bearer rotated",
    ]


def test_an_unreachable_server_is_a_transient_error() -> None:
    kube = Kube(Credentials(server="http://127.0.0.1:9", token="t"), timeout=2)
    with pytest.raises(KubeError, match="GET /api/v1/namespaces/ns/configmaps/x"):
        kube.read("v1", "ConfigMap", "ns", "x")


@dataclass(frozen=True)
class Pki:
    ca: str
    server_cert: Path
    server_key: Path
    client_cert: str
    client_key: str
    other_ca: str


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _cert(
    name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
    extend: Callable[[x509.CertificateBuilder], x509.CertificateBuilder] = lambda b: b,
) -> str:
    now = dt.datetime.now(dt.UTC)
    issuer_name, issuer_key = issuer or (name, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
    )
    if issuer is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
    return (
        extend(builder)
        .sign(issuer_key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
        .decode()
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca_key, other_key, server_key, client_key = _key(), _key(), _key(), _key()
    ca = _cert("test-ca", ca_key, None)
    server = _cert(
        "apiserver",
        server_key,
        ("test-ca", ca_key),
        lambda b: b.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            False,
        ),
    )
    (folder / "server.crt").write_text(server)
    (folder / "server.key").write_text(_pem_key(server_key))
    return Pki(
        ca=ca,
        server_cert=folder / "server.crt",
        server_key=folder / "server.key",
        client_cert=_cert("llmop", client_key, ("test-ca", ca_key)),
        client_key=_pem_key(client_key),
        other_ca=_cert("other-ca", other_key, None),
    )


@pytest.fixture
def tls_server(pki: Pki, seen: Seen) -> Iterator[str]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    context.load_verify_locations(cadata=pki.ca)
    context.verify_mode = ssl.CERT_REQUIRED  # the API server's client-certificate login
    yield from _serve(seen, context)


def test_tls_verifies_the_server_and_presents_the_client_certificate(
    tls_server: str, pki: Pki, seen: Seen
) -> None:
    creds = Credentials(
        server=tls_server, ca_data=pki.ca, cert_data=pki.client_cert, key_data=pki.client_key
    )
    assert Kube(creds).read("v1", "ConfigMap", "ns", "x") is not None
    assert "Authorization" not in seen.requests[0]["headers"]


def test_a_server_signed_by_another_ca_is_refused(tls_server: str, pki: Pki) -> None:
    creds = Credentials(
        server=tls_server, ca_data=pki.other_ca, cert_data=pki.client_cert, key_data=pki.client_key
    )
    with pytest.raises(KubeError, match="CERTIFICATE_VERIFY_FAILED"):
        Kube(creds).read("v1", "ConfigMap", "ns", "x")


def test_insecure_skip_tls_verify_accepts_any_server(tls_server: str, pki: Pki) -> None:
    creds = Credentials(
        server=tls_server, insecure=True, cert_data=pki.client_cert, key_data=pki.client_key
    )
    assert Kube(creds).read("v1", "ConfigMap", "ns", "x") is not None


def test_a_bad_client_key_is_an_error_that_names_the_server(pki: Pki) -> None:
    creds = Credentials(server="https://127.0.0.1:1", cert_data=pki.client_cert, key_data="junk")
    with pytest.raises(KubeError, match=r"TLS settings for https://127.0.0.1:1"):
        Kube(creds)


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_a_fenced_client_cuts_the_request_in_flight_and_sends_no_other(
    tls: bool, request: pytest.FixtureRequest, seen: Seen
) -> None:
    """A leader that lost its Lease fences its client (`llmop.main`): a PUT hanging on the API
    server fails at once instead of at its 30 s deadline, is not sent again (urllib3 retries a
    PUT whose connection broke), and nothing later leaves the process."""
    if tls:
        pki: Pki = request.getfixturevalue("pki")
        server = request.getfixturevalue("tls_server")
        creds = Credentials(
            server=server, ca_data=pki.ca, cert_data=pki.client_cert, key_data=pki.client_key
        )
    else:
        creds = Credentials(server=request.getfixturevalue("plain_server"), token="t")
    kube = Kube(creds, timeout=30)
    assert kube.read("v1", "ConfigMap", "ns", "x") is not None  # a pooled, idle connection
    hanging = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "hang", "namespace": "ns"},
    }
    outcome: list[BaseException | None] = []

    def put() -> None:
        try:
            kube.replace(hanging)
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=put, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while len(seen.requests) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [r["method"] for r in seen.requests] == ["GET", "PUT"]
    started = time.monotonic()
    kube.fence()
    thread.join(5)
    assert not thread.is_alive()
    assert time.monotonic() - started < 2
    assert isinstance(outcome[0], KubeError), outcome
    with pytest.raises(KubeError, match="fenced"):
        kube.read("v1", "ConfigMap", "ns", "x")
    seen.release.set()
    time.sleep(0.2)
    assert [r["method"] for r in seen.requests] == ["GET", "PUT"], "sent again after the fence"
    assert kube.fenced


def test_a_client_without_retries_gives_up_after_one_timeout(plain_server: str, seen: Seen) -> None:
    """The leader Lease's client (`main._elector`): a hung API server costs one timeout per
    request, not four (urllib3 retries a timed-out GET three times), so an attempt to renew
    ends within its deadline."""
    kube = Kube(Credentials(server=plain_server, token="t"), timeout=0.5, retry=False)
    started = time.monotonic()
    with pytest.raises(KubeError, match="hang"):
        kube.read("v1", "ConfigMap", "ns", "hang")
    assert time.monotonic() - started < 1.5
    assert [r["path"] for r in seen.requests] == ["/api/v1/namespaces/ns/configmaps/hang"]
