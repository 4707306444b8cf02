"""`llmop.credentials`: the service account, kubeconfig merging and paths, exec plugins."""

from __future__ import annotations

import base64
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from llmop import credentials
from llmop.credentials import Credentials, CredentialsError


def _kubeconfig(
    path: Path,
    *,
    user: dict[str, Any],
    cluster: dict[str, Any] | None = None,
    current: str | None = "main",
    name: str = "main",
    namespace: str | None = None,
) -> Path:
    context: dict[str, Any] = {"cluster": name, "user": name}
    if namespace:
        context["namespace"] = namespace
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster or {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": context}],
    }
    if current:
        document["current-context"] = current
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document))
    return path


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_a_kubeconfig_gives_its_current_context_with_relative_paths_from_its_folder(
    tmp_path: Path,
) -> None:
    path = _kubeconfig(
        tmp_path / "conf" / "config",
        cluster={"server": "https://10.0.0.1:6443", "certificate-authority": "pki/ca.crt"},
        user={"client-certificate": "pki/admin.crt", "client-key": "/abs/admin.key"},
        namespace="team-a",
    )
    found = credentials.load(path)
    assert found.server == "https://10.0.0.1:6443"
    assert found.ca_file == str(tmp_path / "conf" / "pki" / "ca.crt")
    assert found.cert_file == str(tmp_path / "conf" / "pki" / "admin.crt")
    assert found.key_file == "/abs/admin.key"
    assert found.namespace == "team-a"
    assert found.token is None
    assert not found.renewable


def test_inline_data_is_decoded_and_a_token_file_is_read_each_time(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("first\n")
    path = _kubeconfig(
        tmp_path / "config",
        cluster={
            "server": "https://k:6443",
            "certificate-authority-data": _b64("CA PEM"),
            "tls-server-name": "kubernetes",
        },
        user={"tokenFile": "token", "client-certificate-data": _b64("CERT"), "client-key-data": ""},
    )
    found = credentials.load(path)
    assert (found.ca_data, found.cert_data, found.key_data) == ("CA PEM", "CERT", None)
    assert found.tls_server_name == "kubernetes"
    assert found.current_token() == "first"
    token_file.write_text("second")
    assert found.current_token() == "second"
    assert found.renewable


def test_a_token_wins_over_a_token_file(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path / "config", user={"token": "inline", "tokenFile": "absent"})
    found = credentials.load(path)
    assert (found.current_token(), found.token_file, found.renewable) == ("inline", None, False)


def test_kubeconfig_files_merge_the_first_to_name_a_thing_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _kubeconfig(tmp_path / "a", user={"token": "from-a"}, current=None, name="main")
    second = _kubeconfig(
        tmp_path / "b",
        user={"token": "from-b"},
        cluster={"server": "https://b:6443"},
        current="main",
        name="main",
    )
    missing = tmp_path / "absent"
    monkeypatch.setenv("KUBECONFIG", f"{missing}:{first}:{second}")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    found = credentials.load()
    # The current context comes from b (a sets none); the names were all defined by a first.
    assert (found.server, found.token) == ("https://127.0.0.1:6443", "from-a")


def test_no_current_context_is_an_error_that_names_the_files(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path / "config", user={"token": "t"}, current=None)
    with pytest.raises(CredentialsError, match=r"no current-context in kubeconfig .*config"):
        credentials.load(path)


def test_a_context_naming_an_undefined_cluster_is_an_error(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path / "config", user={"token": "t"})
    document = yaml.safe_load(path.read_text())
    document["contexts"][0]["context"]["cluster"] = "elsewhere"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(CredentialsError, match="context 'main' has no cluster server"):
        credentials.load(path)


def test_in_a_pod_the_service_account_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("pod-token\n")
    (account / "namespace").write_text("llmop-system")
    (account / "ca.crt").write_text("CA")
    monkeypatch.setattr(credentials, "SERVICE_ACCOUNT_DIR", account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path / "config", user={"token": "t"})))
    found = credentials.load()
    assert found.server == "https://[fd00::1]:443"
    assert found.ca_file == str(account / "ca.crt")
    assert found.namespace == "llmop-system"
    assert found.current_token() == "pod-token"
    assert found.renewable


PLUGIN = """\
import json, os, sys
request = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
status = {"token": sys.argv[1] + ":" + os.environ["PLUGIN_GREETING"] + ":"
          + str(request["spec"]["interactive"]) + ":" + request["spec"]["cluster"]["server"]}
if len(sys.argv) > 2:
    status["expirationTimestamp"] = sys.argv[2]
print(json.dumps({"apiVersion": request["apiVersion"], "kind": "ExecCredential",
                  "status": status}))
"""


def _plugin_kubeconfig(tmp_path: Path, *args: str, script: str = PLUGIN) -> Path:
    (tmp_path / "bin").mkdir(exist_ok=True)
    plugin = tmp_path / "bin" / "plugin"
    plugin.write_text(f"#!{sys.executable}\n{script}")
    plugin.chmod(0o755)
    return _kubeconfig(
        tmp_path / "config",
        user={
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1beta1",
                "command": "./bin/plugin",  # relative, with a separator: from the file's folder
                "args": list(args),
                "env": [{"name": "PLUGIN_GREETING", "value": "hello"}],
                "provideClusterInfo": True,
                "interactiveMode": "Never",
            },
            "client-certificate": "ignored-when-a-plugin-answers.crt",
        },
    )


def test_an_exec_plugin_is_run_non_interactively_and_its_expiry_kept(tmp_path: Path) -> None:
    expires = (datetime.now(UTC) + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    found = credentials.load(_plugin_kubeconfig(tmp_path, "tok", expires))
    assert found.token == "tok:hello:False:https://127.0.0.1:6443"
    assert found.cert_file is None
    assert found.expires == datetime.fromisoformat(expires.replace("Z", "+00:00"))
    assert found.renewable
    assert not found.expired(datetime.now(UTC))
    assert found.expired(datetime.now(UTC) + timedelta(minutes=5))


def test_a_failing_exec_plugin_is_an_error_with_its_stderr(tmp_path: Path) -> None:
    script = "import sys\nprint('the SSO session expired', file=sys.stderr)\nsys.exit(3)\n"
    with pytest.raises(CredentialsError, match="exited 3: the SSO session expired"):
        credentials.load(_plugin_kubeconfig(tmp_path, script=script))


def test_an_exec_plugin_without_credentials_is_an_error(tmp_path: Path) -> None:
    script = "import json\nprint(json.dumps({'kind': 'ExecCredential', 'status': {}}))\n"
    with pytest.raises(CredentialsError, match="has no credentials"):
        credentials.load(_plugin_kubeconfig(tmp_path, script=script))


def test_credentials_without_expiry_never_expire() -> None:
    assert not Credentials(server="https://k").expired(datetime.now(UTC) + timedelta(days=3650))


def test_the_kubeconfig_may_be_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "current-context": "c",
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:8080"}}],
                "users": [{"name": "u", "user": {"username": "admin", "password": "pw"}}],
            }
        )
    )
    found = credentials.load(path)
    assert (found.server, found.username, found.password) == (
        "http://127.0.0.1:8080",
        "admin",
        "pw",
    )


def test_kopf_logs_in_with_the_same_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kopf

    from llmop import handlers

    path = _kubeconfig(
        tmp_path / "config",
        cluster={"server": "https://10.0.0.1:6443", "certificate-authority-data": _b64("CA")},
        user={"token": "secret"},
        namespace="team-a",
    )
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    login = cast("Any", handlers.login)  # typed by kopf's decorator as an activity
    info = login()
    assert (info.server, info.ca_data, info.scheme, info.token, info.default_namespace) == (
        "https://10.0.0.1:6443",
        "CA",
        "Bearer",
        "secret",
        "team-a",
    )
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(kopf.PermanentError, match="no current-context"):
        login()
