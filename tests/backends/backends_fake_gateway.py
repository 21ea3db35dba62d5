"""ClawManager's AI gateway, faked on 127.0.0.1 with the server's route layout
(clawmanager-notes.md section 10): under `<BASE>` = `http://127.0.0.1:<port>/api/v1/gateway/llm`
    POST /v1/responses                          OpenAI Responses (backends_fake_provider's answers)
    POST /v1/messages                           Anthropic Messages (backends_fake_anthropic's)
    POST /chat/completions, /v1/chat/completions  Chat Completions (backends_fake_chat's)
    GET  /models                                the catalogue
with the instance token as the bearer credential (`Authorization: Bearer <token>`; anything
else: 401) and 404 on any other path, the gateway's prefix included. A POST naming a model the
catalogue does not list is answered 404 `model_not_found`, as FakeProvider(models=…) does.

`FakeGateway(script, token, catalogue, model)`: the n-th POST on a wire gets `script[n]`, in
that wire's entry shape (one CLI per test, so one shape per script). Every request that passed
the path and the token is recorded with its full path; `refused` holds the others.
"""
from __future__ import annotations

import io
import json
from typing import Any

from backends_fake_anthropic import _Handler as MessagesHandler
from backends_fake_chat import FakeChat
from backends_fake_chat import _ChatHandler as ChatHandler
from backends_fake_provider import _Handler as ResponsesHandler

PREFIX = "/api/v1/gateway/llm"
ROUTES = {"/v1/responses": "responses", "/v1/messages": "messages", "/chat/completions": "chat",
          "/v1/chat/completions": "chat"}


class _GatewayHandler(MessagesHandler, ChatHandler):
    """The three fakes' answers behind the gateway's prefix, token and catalogue."""

    def _admit(self, method: str) -> str | None:
        """The route of this request, or None after answering it (404, 401) as the gateway does."""
        gateway: FakeGateway = self.server.provider  # type: ignore[attr-defined]
        path = self.path.split("?", 1)[0]
        rest = path[len(PREFIX):] if path.startswith(PREFIX + "/") else None
        route = "models" if rest == "/models" and method == "GET" else ROUTES.get(rest or "") if method == "POST" \
            else None
        if route is None:
            gateway.refused.append({"method": method, "path": self.path, "status": 404})
            self._reply(404, {"error": {"message": f"no route {method} {path}", "type": "not_found"}})
            return None
        if self.headers.get("Authorization") != f"Bearer {gateway.token}":
            gateway.refused.append({"method": method, "path": self.path, "status": 401})
            self._reply(401, {"error": {"message": "invalid instance token", "type": "authentication_error"}})
            return None
        return route

    def _reply(self, status: int, doc: dict[str, Any]) -> None:
        self.close_connection = True  # a body left unread must not be taken for the next request
        self._json(status, doc)

    def do_GET(self) -> None:
        gateway: FakeGateway = self.server.provider  # type: ignore[attr-defined]
        if self._admit("GET") is None:
            return
        gateway.record(self, b"")
        self._json(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in gateway.models or []]})

    def do_POST(self) -> None:
        route = self._admit("POST")
        if route is None:
            return
        body = self._body()
        refused = self.server.provider.refusal(body)  # type: ignore[attr-defined]
        full, kept = self.path, self.rfile
        self.path = full[len(PREFIX):]  # what each fake's handler expects
        self.rfile = io.BytesIO(body)  # each reads the body itself: it gets it again, sized
        del self.headers["Transfer-Encoding"], self.headers["Content-Length"]
        self.headers["Content-Length"] = str(len(body))
        self.full_path = full
        try:
            if refused is not None:
                self.server.provider.record(self, body)  # type: ignore[attr-defined]
                return self._error(refused)
            handler = {"responses": ResponsesHandler, "messages": MessagesHandler, "chat": ChatHandler}[route]
            handler.do_POST(self)
        finally:
            self.path, self.rfile = full, kept

    def _body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._chunked()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""


class FakeGateway(FakeChat):
    handler = _GatewayHandler

    def __init__(self, script: list[dict[str, Any]], token: str, catalogue: list[str], model: str = "auto"):
        super().__init__(script, model=model)
        self.token, self.models = token, list(catalogue)
        self.refused: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        """`<BASE>`, as ClawManager injects it in CLAWMANAGER_LLM_BASE_URL."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{PREFIX}"

    def record(self, handler: Any, body: bytes) -> tuple[dict[str, Any], int]:
        entry, n = super().record(handler, body)
        try:
            model = json.loads(body).get("model") if body else None
        except (ValueError, AttributeError):
            model = None
        self._full_path(handler, body, model=model)
        return entry, n

    def record_chat(self, handler: Any, body: bytes) -> tuple[dict[str, Any], int, dict[str, Any]]:
        out = super().record_chat(handler, body)
        self._full_path(handler, body)
        return out

    def _full_path(self, handler: Any, body: bytes, **more: Any) -> None:
        """The request just recorded (its body tells it from one recorded meanwhile) gets its
        full path, the gateway's prefix included."""
        text = body.decode("utf-8", "replace")
        with self.lock:
            found = next(r for r in reversed(self.requests) if "routed" not in r and r["body"] == text)
            found.update(more, path=getattr(handler, "full_path", handler.path), routed=True)

    def injected(self, **extra: str | None) -> dict[str, str]:
        """The gateway variables as ClawManager's server injects them (buildGatewayEnv) for this
        gateway; `extra` overrides (None: left out)."""
        env: dict[str, str | None] = {
            "CLAWMANAGER_LLM_BASE_URL": self.url, "CLAWMANAGER_LLM_API_KEY": self.token,
            "CLAWMANAGER_LLM_MODEL": json.dumps(self.models), "CLAWMANAGER_LLM_PROVIDER": "openai-compatible",
            "CLAWMANAGER_LLM_PROVIDER_MODELS": json.dumps(
                ["auto/auto"] + [f"fake/{m}" for m in self.models if m != "auto"]),
            "CLAWMANAGER_INSTANCE_TOKEN": self.token, "OPENAI_BASE_URL": self.url, "OPENAI_API_BASE": self.url,
            "OPENAI_API_KEY": self.token, "OPENAI_MODEL": "auto",
            # an opencode instance's (buildGatewayEnv): the server's password is the gateway token
            "OPENCODE_SERVER_USERNAME": "opencode", "OPENCODE_SERVER_PASSWORD": self.token}
        env.update(extra)
        return {k: v for k, v in env.items() if v is not None}
