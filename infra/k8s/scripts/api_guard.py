"""ASGI middleware for `vllm serve --middleware api_guard.ApiKeyGuard`: every request carries the API key.

vLLM's own key check (`--api-key` / `VLLM_API_KEY`) guards only paths that
start with /v1, /v2, /inference or /cohere (vLLM 0.34.0,
vllm/entrypoints/serve/middleware/authenticate.py, GUARDED_PREFIX). The same
server answers, without a key, /invocations (SageMaker's route: it runs chat
and completion requests, serve/sagemaker/api_router.py), /scale_elastic_ep
(serve/elastic_ep/api_router.py), /tokenize, /detokenize, /pooling, /score,
/rerank and more. This guard refuses every path without
`Authorization: Bearer <VLLM_API_KEY>` except the probes and the metrics, which
answer nothing a caller could abuse: OPEN_PATHS.

vLLM adds `--middleware` classes with `app.add_middleware(cls)`, after its own
(entrypoints/serve/middleware/register.py), so this one is the outermost and
sees every request first. It takes the key from the environment (the pod gets
it from a Secret) and refuses to start without one: an API left open by a
missing Secret would be worse than an API that does not start. Standard library
only: it runs in the serving image as it is.
"""

import hashlib
import hmac
import os

KEY_ENV = "VLLM_API_KEY"
# Exact paths served without a key: the kubelet's probes (/health), SageMaker's (/ping), Prometheus (/metrics,
# mounted as a sub-application, so also /metrics/), the release (/version).
OPEN_PATHS = frozenset({"/health", "/ping", "/metrics", "/metrics/", "/version"})
UNAUTHORIZED = b'{"error": "Unauthorized"}'


class ApiKeyGuard:
    def __init__(self, app):
        key = os.environ.get(KEY_ENV, "")
        if not key:
            raise RuntimeError(KEY_ENV + " is not set: refusing to serve an API without a key")
        self.app = app
        self.key_digest = hashlib.sha256(key.encode("utf-8")).digest()

    def open(self, scope):
        if scope.get("method") == "OPTIONS":  # CORS preflight, as vLLM's own check lets it through
            return True
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        return path in OPEN_PATHS

    def authorized(self, scope):
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    digest = hashlib.sha256(token.strip().encode("utf-8")).digest()
                    return hmac.compare_digest(digest, self.key_digest)
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self.open(scope) or self.authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation, before the handshake
            return
        await send({
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(UNAUTHORIZED)).encode("ascii")),
                (b"www-authenticate", b"Bearer"),
            ],
        })
        await send({"type": "http.response.body", "body": UNAUTHORIZED})
