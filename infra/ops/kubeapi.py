"""A read-only Kubernetes API client from a kubeconfig: the standard library and PyYAML, nothing else.

`python -m infra rollout` needs a few GETs (Jobs, Pods, a RayCluster, pod logs, a
Service proxy). The `kubernetes` client is not a dependency of this project and
would bring a large tree for that, so this module reads the kubeconfig itself and
speaks HTTP with `http.client`. It understands what the stack's own kubeconfig
holds (infra/aws/access.py, `kubeconfig_document`) and the common rest:

- the current context's cluster: `server`, `certificate-authority-data` or
  `certificate-authority`, `tls-server-name` (the private-ssm kubeconfig points
  at `https://localhost:<port>`, the tunnel's local end, and verifies the API
  server's certificate against the endpoint's host name), and
  `insecure-skip-tls-verify`;
- the user: `token` / `tokenFile`, `client-certificate(-data)` with
  `client-key(-data)`, and an `exec` credential plugin (the stack's runs `aws
  eks get-token`): run with its args and env plus `KUBERNETES_EXEC_INFO`, its
  ExecCredential's `status.token` used until `status.expirationTimestamp`
  (Kubernetes docs, "Authenticating", client-go credential plugins).

Errors a user can fix (no kubeconfig, a closed tunnel, a refused token, no
permission, a missing `aws` command) are `UserError`s with one line that says
what to do; `NotFound` is its own error, since a missing object is often just
"not created yet".
"""

from __future__ import annotations

import base64
import datetime as dt
import http.client
import json
import os
import socket
import ssl
import subprocess
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from infra.errors import UserError

REQUEST_TIMEOUT_S = 30.0
# An exec plugin's token is used until this long before it expires.
TOKEN_REFRESH_MARGIN_S = 60.0
EXEC_TIMEOUT_S = 60.0
TUNNEL_HINT = "with the private-ssm endpoint, open the API tunnel first (docs/deploying.md, \"The first `up`: reaching the cluster API\")"


class NotFound(Exception):
    """The API answered 404: the object does not exist (yet)."""


class Unreachable(UserError):
    """The API server could not be reached, or gave no answer in time (`timed_out`)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class ApiError(Exception):
    """The API answered with an error status that is not the user's to fix (e.g. 5xx)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def default_kubeconfig_path(environ: Optional[dict[str, str]] = None) -> Path:
    """kubectl's order: the first file of $KUBECONFIG, else ~/.kube/config."""
    env = os.environ if environ is None else environ
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    return Path(listed[0]).expanduser() if listed else Path("~/.kube/config").expanduser()


@dataclass
class Credentials:
    """How to authenticate: a fixed token, a client certificate, or an exec plugin run when needed."""

    token: Optional[str] = None
    cert_pem: Optional[bytes] = None
    key_pem: Optional[bytes] = None
    exec_spec: Optional[dict] = None
    _cached: Optional[tuple[str, Optional[dt.datetime]]] = field(default=None, repr=False)

    def bearer(self, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> Optional[str]:
        if self.token:
            return self.token
        if not self.exec_spec:
            return None
        now = dt.datetime.now(dt.timezone.utc)
        if self._cached and (self._cached[1] is None or (self._cached[1] - now).total_seconds() > TOKEN_REFRESH_MARGIN_S):
            return self._cached[0]
        self._cached = exec_token(self.exec_spec, run)
        return self._cached[0]


def exec_token(spec: dict, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> tuple[str, Optional[dt.datetime]]:
    """Run a kubeconfig's exec credential plugin; (token, expiry or None)."""
    command = spec.get("command")
    if not command:
        raise UserError("the kubeconfig's exec credential plugin names no command")
    argv = [command, *[str(a) for a in spec.get("args") or []]]
    api_version = spec.get("apiVersion", "client.authentication.k8s.io/v1beta1")
    env = dict(os.environ)
    env.update({e["name"]: str(e["value"]) for e in spec.get("env") or [] if "name" in e})
    # client-go passes the ExecCredential it expects; plugins may read it (Kubernetes docs, "client-go credential plugins").
    env["KUBERNETES_EXEC_INFO"] = json.dumps({"apiVersion": api_version, "kind": "ExecCredential", "spec": {"interactive": False}})
    try:
        done = run(argv, env=env, capture_output=True, text=True, timeout=EXEC_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        hint = ": install the AWS CLI v2 (docs/deploying.md)" if Path(command).name == "aws" else ""
        raise UserError(f"the kubeconfig runs `{command}` for a token and it is not on PATH{hint}") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"`{' '.join(argv[:3])} ...` gave no token within {EXEC_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise UserError(f"`{' '.join(argv[:3])} ...` failed (exit {done.returncode}): {why[-1] if why else 'no message'}")
    try:
        status = json.loads(done.stdout)["status"]
        token = status["token"]
    except (ValueError, KeyError, TypeError):
        raise UserError(f"`{' '.join(argv[:3])} ...` printed no ExecCredential with status.token") from None
    expiry = status.get("expirationTimestamp")
    return token, (dt.datetime.fromisoformat(expiry.replace("Z", "+00:00")) if expiry else None)


@dataclass
class Cluster:
    server: str
    tls_server_name: Optional[str] = None
    ca_pem: Optional[str] = None
    insecure: bool = False


def _read_data(entry: dict, key: str, base: Path) -> Optional[bytes]:
    """`<key>-data` (base64) or `<key>` (a file, relative to the kubeconfig)."""
    if entry.get(f"{key}-data"):
        return base64.b64decode(entry[f"{key}-data"])
    if entry.get(key):
        path = Path(entry[key]).expanduser()
        return (path if path.is_absolute() else base / path).read_bytes()
    return None


def _named(items: Any, name: str, kind: str, source: Path) -> dict:
    for item in items or []:
        if isinstance(item, dict) and item.get("name") == name:
            return item.get(kind) or {}
    raise UserError(f"{source}: no {kind} named {name!r}")


def load_kubeconfig(path: Path, context: Optional[str] = None) -> tuple[Cluster, Credentials]:
    """The cluster and credentials of `context` (default: the current one) in the kubeconfig at `path`."""
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UserError(
            f"no kubeconfig at {path}: write the stack's with `pulumi stack output kubeconfig --show-secrets --stack STACK > {path}`"
        ) from None
    except (OSError, yaml.YAMLError) as err:
        raise UserError(f"cannot read the kubeconfig {path}: {str(err).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path} is not a kubeconfig")
    name = context or doc.get("current-context")
    if not name:
        raise UserError(f"{path} has no current-context")
    ctx = _named(doc.get("contexts"), name, "context", path)
    cluster = _named(doc.get("clusters"), ctx.get("cluster", ""), "cluster", path)
    user = _named(doc.get("users"), ctx.get("user", ""), "user", path) if ctx.get("user") else {}
    base = path.parent
    if not cluster.get("server"):
        raise UserError(f"{path}: cluster {ctx.get('cluster')!r} has no server")
    try:
        ca = _read_data(cluster, "certificate-authority", base)
        cert = _read_data(user, "client-certificate", base)
        key = _read_data(user, "client-key", base)
        token = user.get("token") or (Path(user["tokenFile"]).read_text().strip() if user.get("tokenFile") else None)
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: cannot read a credential or CA it names: {err}") from None
    return (
        Cluster(
            server=cluster["server"].rstrip("/"),
            tls_server_name=cluster.get("tls-server-name"),
            ca_pem=ca.decode() if ca else None,
            insecure=bool(cluster.get("insecure-skip-tls-verify")),
        ),
        Credentials(token=token, cert_pem=cert, key_pem=key, exec_spec=user.get("exec")),
    )


def tls_context(cluster: Cluster, creds: Credentials) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=cluster.ca_pem) if cluster.ca_pem else ssl.create_default_context()
    if cluster.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if creds.cert_pem and creds.key_pem:
        # load_cert_chain reads files only: written briefly to a private directory.
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
            cert.write_bytes(creds.cert_pem)
            key.touch(mode=0o600)
            key.write_bytes(creds.key_pem)
            ctx.load_cert_chain(str(cert), str(key))
    return ctx


class _Https(http.client.HTTPSConnection):
    """HTTPS whose certificate is checked against `server_name` (kubeconfig `tls-server-name`), not the host dialled."""

    def __init__(self, host: str, port: Optional[int], *, tls: ssl.SSLContext, server_name: Optional[str], timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=tls)
        self._tls = tls
        self._server_name = server_name

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout, self.source_address)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self._server_name or self.host)


@dataclass
class Response:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def from_backend(self) -> bool:
        """Not the API server's own answer (a metav1.Status), so a proxied service's: through the Service proxy
        the API server hands on the backend's status and body as they are."""
        try:
            doc = json.loads(self.body)
        except ValueError:
            return True
        return not (isinstance(doc, dict) and doc.get("kind") == "Status")

    def status_message(self) -> str:
        """The API's `Status` message (or the body's start)."""
        try:
            doc = json.loads(self.body)
            if isinstance(doc, dict) and doc.get("message"):
                return str(doc["message"])
        except ValueError:
            pass
        return self.text.strip()[:300] or http.client.responses.get(self.status, "")


class KubeApi:
    """GETs against one cluster. `get` returns the Response of any status; `get_json`/`get_text` raise."""

    def __init__(self, cluster: Cluster, creds: Credentials, *, timeout: float = REQUEST_TIMEOUT_S) -> None:
        self.cluster = cluster
        self.creds = creds
        self.timeout = timeout
        url = urllib.parse.urlsplit(cluster.server)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise UserError(f"kubeconfig server {cluster.server!r} is not an http(s) URL")
        self._scheme, self._host, self._port = url.scheme, url.hostname, url.port
        self._prefix = url.path.rstrip("/")
        self._tls = tls_context(cluster, creds) if url.scheme == "https" else None

    @classmethod
    def from_kubeconfig(cls, path: Path, context: Optional[str] = None) -> "KubeApi":
        return cls(*load_kubeconfig(path, context))

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._tls is None:
            return http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        return _Https(self._host, self._port, tls=self._tls, server_name=self.cluster.tls_server_name, timeout=timeout)

    def get(self, path: str, query: Optional[dict[str, Any]] = None, *, timeout: Optional[float] = None) -> Response:
        """One GET; raises UserError when the API cannot be reached or refuses the credentials."""
        target = self._prefix + path + ("?" + urllib.parse.urlencode(query) if query else "")
        headers = {"Accept": "application/json, */*", "User-Agent": "gpu-serving-rollout"}
        token = self.creds.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        conn = self._connection(self.timeout if timeout is None else timeout)
        try:
            conn.request("GET", target, headers=headers)
            reply = conn.getresponse()
            response = Response(reply.status, reply.read())
        except ssl.SSLCertVerificationError as err:
            raise UserError(
                f"the API server at {self.cluster.server} failed TLS verification ({err.verify_message}): "
                "is the kubeconfig the stack's (its CA and tls-server-name)?"
            ) from None
        except (OSError, http.client.HTTPException) as err:
            reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
            raise Unreachable(
                f"cannot reach the Kubernetes API at {self.cluster.server} ({reason}); {TUNNEL_HINT}",
                timed_out=isinstance(err, TimeoutError),
            ) from None
        finally:
            conn.close()
        if response.status == 401 and not (response.from_backend() and "/proxy/" in path):
            raise UserError(
                f"the Kubernetes API refused the credentials (401 Unauthorized): check the AWS identity "
                f"`aws eks get-token` runs as (profile, expiry) and its access entry on the cluster"
            )
        if response.status == 403 and "/proxy/" not in path:
            raise UserError(f"not allowed to read {path.split('?')[0]} (403): {response.status_message()}")
        return response

    def get_json(self, path: str, query: Optional[dict[str, Any]] = None) -> Any:
        response = self.get(path, query)
        if response.status == 404:
            raise NotFound(path)
        if response.status != 200:
            raise ApiError(response.status, response.status_message())
        try:
            return response.json()
        except ValueError:
            raise ApiError(response.status, f"not JSON from {path}") from None

    def get_text(self, path: str, query: Optional[dict[str, Any]] = None) -> str:
        response = self.get(path, query)
        if response.status == 404:
            raise NotFound(path)
        if response.status != 200:
            raise ApiError(response.status, response.status_message())
        return response.text
