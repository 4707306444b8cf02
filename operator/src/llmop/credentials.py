"""Cluster credentials, found the way kubectl finds them: the pod's service account, else the
kubeconfig (the files in `KUBECONFIG`, merged with the first one to name a thing winning, else
~/.kube/config), including its exec credential plugins.

The one module that reads credential files and runs credential plugins. `llmop.kube` opens its
connections with what `load` returns and `llmop.handlers` gives the same to kopf's login, so the
process's two clients of the API server authenticate alike, whatever else is installed. Not the
`kubernetes` client library's loader: importing that package cost the operator 16 MiB of memory
and 0.3 CPU-s at start, for this alone. Not supported: the deprecated `auth-provider` plugins
(kubectl dropped them for exec plugins) and a kubeconfig's `proxy-url`.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = "~/.kube/config"
EXEC_API_VERSION = "client.authentication.k8s.io/v1"
EXEC_TIMEOUT_SECONDS = 60.0
EXPIRY_MARGIN = timedelta(seconds=10)
"""A plugin's token is renewed this long before it expires, so no request carries a dead one."""


class CredentialsError(Exception):
    """No usable credentials: the message says where they were looked for and what was wrong."""


@dataclass(frozen=True)
class Credentials:
    """Where the API server is and how to prove who we are to it."""

    server: str
    ca_file: str | None = None
    ca_data: str | None = None
    """PEM."""
    insecure: bool = False
    tls_server_name: str | None = None
    token: str | None = None
    token_file: str | None = None
    """Read again from time to time (`Kube`): the kubelet rotates bound service account tokens."""
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: str | None = None
    key_data: str | None = None
    username: str | None = None
    password: str | None = None
    namespace: str | None = None
    expires: datetime | None = None
    """When an exec plugin's credentials stop being valid (UTC); None: they do not expire."""
    renewable: bool = False
    """Whether loading again may give other credentials (a token file, an exec plugin): worth
    doing when the API server answers 401."""

    def current_token(self) -> str | None:
        """The bearer token, from its file when it has one."""
        if self.token_file is None:
            return self.token
        try:
            return Path(self.token_file).read_text(encoding="utf-8").strip() or None
        except OSError as error:
            raise CredentialsError(f"token file {self.token_file}: {error}") from error

    def expired(self, now: datetime) -> bool:
        """Whether the credentials are (about to be) too old to use."""
        return self.expires is not None and now >= self.expires - EXPIRY_MARGIN


def load(kubeconfig: str | os.PathLike[str] | None = None) -> Credentials:
    """`kubeconfig`'s current context when given; else in-cluster, else `KUBECONFIG` or
    ~/.kube/config."""
    if kubeconfig is not None:
        return _from_kubeconfig([Path(kubeconfig)])
    in_cluster = _from_service_account(os.environ)
    if in_cluster is not None:
        return in_cluster
    listed = os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    paths = [Path(p).expanduser() for p in listed.split(os.pathsep) if p.strip()]
    return _from_kubeconfig(paths)


def _from_service_account(environ: Mapping[str, str]) -> Credentials | None:
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    token_file = SERVICE_ACCOUNT_DIR / "token"
    if not host or not port or not token_file.exists():
        return None
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    namespace_file = SERVICE_ACCOUNT_DIR / "namespace"
    ca_file = SERVICE_ACCOUNT_DIR / "ca.crt"
    return Credentials(
        server=f"https://{host}:{port}",
        ca_file=str(ca_file) if ca_file.exists() else None,
        token_file=str(token_file),
        namespace=namespace_file.read_text().strip() if namespace_file.exists() else None,
        renewable=True,
    )


@dataclass(frozen=True)
class _Entry:
    """A named cluster, user or context, and the directory its relative paths start from."""

    body: Mapping[str, Any]
    base: Path


def _merged(paths: list[Path]) -> tuple[str | None, dict[str, dict[str, _Entry]]]:
    """kubectl's merge: the first file to set the current context or a name wins; a listed file
    that does not exist is skipped."""
    current: str | None = None
    found: dict[str, dict[str, _Entry]] = {"clusters": {}, "users": {}, "contexts": {}}
    singular = {"clusters": "cluster", "users": "user", "contexts": "context"}
    for path in paths:
        if not path.exists():
            continue
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as error:
            raise CredentialsError(f"kubeconfig {path}: {error}") from error
        if not isinstance(document, dict):
            raise CredentialsError(f"kubeconfig {path}: not a mapping")
        current = current or document.get("current-context") or None
        for section, key in singular.items():
            for item in document.get(section) or []:
                name = item.get("name")
                if name is not None and name not in found[section]:
                    found[section][name] = _Entry(item.get(key) or {}, path.parent)
    return current, found


def _from_kubeconfig(paths: list[Path]) -> Credentials:
    where = os.pathsep.join(str(p) for p in paths)
    current, found = _merged(paths)
    if current is None:
        raise CredentialsError(
            f"no cluster credentials: not in a pod, and no current-context in kubeconfig {where}"
        )
    context = found["contexts"].get(current)
    if context is None:
        raise CredentialsError(f"kubeconfig {where}: context {current!r} is not defined")
    cluster = found["clusters"].get(context.body.get("cluster", ""))
    if cluster is None or not cluster.body.get("server"):
        raise CredentialsError(f"kubeconfig {where}: context {current!r} has no cluster server")
    user = found["users"].get(context.body.get("user", "")) or _Entry({}, cluster.base)
    u, c = user.body, cluster.body
    plugin: dict[str, Any] = {}
    if u.get("exec"):
        plugin = _run_plugin(u["exec"], user.base, c)
    token = plugin.get("token") or u.get("token") or None  # client-go: token over tokenFile
    return Credentials(
        server=str(c["server"]),
        ca_file=_path(c.get("certificate-authority"), cluster.base),
        ca_data=_decoded(c.get("certificate-authority-data")),
        insecure=bool(c.get("insecure-skip-tls-verify")),
        tls_server_name=c.get("tls-server-name") or None,
        token=token,
        token_file=None if token else _path(u.get("tokenFile"), user.base),
        cert_file=None if plugin else _path(u.get("client-certificate"), user.base),
        key_file=None if plugin else _path(u.get("client-key"), user.base),
        cert_data=plugin.get("clientCertificateData") or _decoded(u.get("client-certificate-data")),
        key_data=plugin.get("clientKeyData") or _decoded(u.get("client-key-data")),
        username=u.get("username") or None,
        password=u.get("password") or None,
        namespace=context.body.get("namespace") or None,
        expires=_timestamp(plugin.get("expirationTimestamp")),
        renewable=bool(plugin) or (token is None and bool(u.get("tokenFile"))),
    )


def _path(value: Any, base: Path) -> str | None:
    if not value:
        return None
    path = Path(str(value)).expanduser()
    return str(path if path.is_absolute() else base / path)


def _decoded(value: Any) -> str | None:
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=False).decode()
    except (ValueError, UnicodeDecodeError) as error:
        raise CredentialsError(f"kubeconfig: a *-data field is not base64 PEM: {error}") from error


def _timestamp(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError as error:
        raise CredentialsError(f"exec plugin: expirationTimestamp {value!r}: {error}") from error
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _run_plugin(spec: Mapping[str, Any], base: Path, cluster: Mapping[str, Any]) -> dict[str, Any]:
    """Run an exec credential plugin (client.authentication.k8s.io), non-interactively; its
    ExecCredential's status."""
    command = str(spec.get("command") or "")
    if not command:
        raise CredentialsError("kubeconfig: users[].user.exec has no command")
    if os.sep in command and not os.path.isabs(command):
        command = str(base / command)  # kubectl: relative to the kubeconfig's directory
    api_version = spec.get("apiVersion") or EXEC_API_VERSION
    request: dict[str, Any] = {
        "apiVersion": api_version,
        "kind": "ExecCredential",
        "spec": {"interactive": False},
    }
    if spec.get("provideClusterInfo"):
        request["spec"]["cluster"] = {
            "server": cluster.get("server"),
            "certificate-authority-data": cluster.get("certificate-authority-data"),
            "insecure-skip-tls-verify": bool(cluster.get("insecure-skip-tls-verify")),
        }
    env = dict(os.environ)
    env.update({str(e["name"]): str(e.get("value", "")) for e in spec.get("env") or []})
    env["KUBERNETES_EXEC_INFO"] = json.dumps(request)
    argv = [command, *(str(a) for a in spec.get("args") or [])]
    try:
        done = subprocess.run(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=EXEC_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise CredentialsError(f"exec plugin {command}: {error}") from error
    if done.returncode != 0:
        raise CredentialsError(
            f"exec plugin {command} exited {done.returncode}: {done.stderr.strip()[-500:]}"
        )
    try:
        status = json.loads(done.stdout).get("status") or {}
    except (ValueError, AttributeError) as error:
        raise CredentialsError(f"exec plugin {command}: not an ExecCredential: {error}") from error
    if not status.get("token") and not status.get("clientCertificateData"):
        raise CredentialsError(f"exec plugin {command}: its ExecCredential has no credentials")
    result: dict[str, Any] = status
    return result
