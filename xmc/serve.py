"""The HTTP service of one model package (FastAPI + uvicorn).

    POST /predict  {"texts": ["..."], "k": 10}  -> {"model", "k", "predictions": [[{id, index, text, score}]]}
    GET  /health   -> {"status": "ok", "model", "labels"}
    GET  /model    -> the package manifest (without its file list)
    GET  /openapi.json, GET /docs (the same schema as one self-contained page: no asset from a CDN)

Loopback by default. Bound to any other address it requires a bearer token (``Authorization: Bearer ...``,
taken from an environment variable, never from the command line). Every limit (texts per request,
characters per text, k, body size) is answered with a 4xx and a one-line message, and every error, the
service's own and the framework's (an unknown path, a wrong method), has one body: ``{"error": "..."}``.
"""

# no `from __future__ import annotations`: FastAPI reads the endpoints' annotations (Request) at definition

import hmac
import html
import ipaddress
import json
import logging
import os
import socket
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from uvicorn.protocols.http.h11_impl import H11Protocol
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from xmc.errors import ConfigError
from xmc.package.registry import load_model

log = logging.getLogger("xmc.serve")

DEFAULT_LIMITS = {"max_texts": 256, "max_chars": 10_000, "max_k": 1000, "batch_size": 256}
MIN_TOKEN_CHARS = 16


class PredictRequest(BaseModel):
    """Texts to rank labels for (the service checks each limit itself, so that each gets its own message)."""
    model_config = ConfigDict(extra="forbid")
    texts: list[str] = Field(min_length=1, description="the texts, each non-empty, without NUL characters",
                             examples=[["she was able to swim across"]])
    k: int = Field(10, ge=1, description="labels per text (at most the service's max_k, see GET /model)")


class LabelScore(BaseModel):
    """One ranked label."""
    id: str = Field(description="the label's id in the dataset (e.g. a WordNet synset id)")
    index: int = Field(description="the label's row in the package's label order (0-based)")
    text: str = Field(description="the label's text")
    score: float = Field(description="the model's score: higher ranks first; its scale is the method's "
                                     "(GET /model: score)")


class PredictResponse(BaseModel):
    model: str
    k: int
    predictions: list[list[LabelScore]] = Field(description="per text, in the request's order, best first")


class HealthResponse(BaseModel):
    status: str = Field(examples=["ok"])
    model: str
    labels: int = Field(description="how many labels the package ranks")


class ErrorResponse(BaseModel):
    """The one body of every error."""
    error: str = Field(description="one line saying what was wrong", examples=["texts[1] is empty"])


ENDPOINTS = "POST /predict, GET /health, GET /model, GET /openapi.json, GET /docs"
ERRORS = {400: "the body is not UTF-8 JSON", 401: "missing or wrong bearer token (non-loopback service)",
          413: "over a limit: texts per request, characters per text, body size",
          422: "a field is missing, of the wrong type or out of range"}


def docs_page(schema: dict[str, Any]) -> str:
    """The OpenAPI schema as one HTML page with no script and no external asset (Swagger UI loads from a CDN,
    which an offline machine cannot reach)."""
    esc = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(schema['info']['title'])}</title>",
             "<style>body{font:15px/1.45 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}"
             "pre{background:#f4f4f4;padding:.6rem;overflow:auto}code{background:#f4f4f4}h2{margin-top:2rem}"
             "</style></head><body>",
             f"<h1>{esc(schema['info']['title'])}</h1><p>{esc(schema['info'].get('description', ''))}</p>",
             "<p>Machine-readable: <a href='/openapi.json'><code>/openapi.json</code></a>. Every error body is "
             "<code>{\"error\": \"...\"}</code>.</p>"]
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            parts.append(f"<h2><code>{esc(method.upper())} {esc(path)}</code></h2>"
                         f"<p>{esc(op.get('summary', ''))}</p><p>{esc(op.get('description', ''))}</p>")
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body:
                parts.append(f"<h3>Request body</h3><pre>{esc(json.dumps(body, indent=2))}</pre>")
            for status, resp in op.get("responses", {}).items():
                sch = resp.get("content", {}).get("application/json", {}).get("schema")
                parts.append(f"<h3>{esc(status)}: {esc(resp.get('description', ''))}</h3>"
                             + (f"<pre>{esc(json.dumps(sch, indent=2))}</pre>" if sch else ""))
    comps = schema.get("components", {}).get("schemas", {})
    if comps:
        parts.append("<h2>Schemas</h2>")
        for name, sch in comps.items():
            parts.append(f"<h3 id='{esc(name)}'>{esc(name)}</h3><pre>{esc(json.dumps(sch, indent=2))}</pre>")
    parts.append("</body></html>")
    return "".join(parts)


def bounded_protocol(max_connections: int) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol that also times out a new connection that sends nothing (uvicorn starts its
    keep-alive timer only after a first response) and closes a connection beyond ``max_connections`` as soon as it
    is accepted: thousands of idle sockets would otherwise hold every file descriptor and stop the service."""

    class BoundedH11Protocol(H11Protocol):
        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.close()
                return
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                self.timeout_keep_alive_handler)

    return BoundedH11Protocol


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def create_app(pkg: Any, limits: dict[str, int] | None = None, token: str | None = None) -> Any:
    """The FastAPI application serving ``pkg`` (a loaded :class:`xmc.package.ModelPackage`)."""
    lim = {**DEFAULT_LIMITS, **(limits or {})}
    # a request may not carry more than its texts allow (JSON escapes included), so a huge body is refused unread
    max_body = lim["max_texts"] * (lim["max_chars"] * 6 + 16) + 4096
    model_lock = threading.Lock()  # one prediction at a time: torch already uses every core for one batch
    app = FastAPI(title=f"xmc: {pkg.name}", description=f"{pkg.method} over {pkg.n_labels} labels",
                  version=str(pkg.manifest.get("code", {}).get("xmc", "")) or "0", docs_url=None, redoc_url=None)
    info = pkg.info()

    def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    # the framework's own errors (an unknown path, a wrong method, a malformed query) in the same envelope
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404:
            message = f"{request.url.path[:200]}: no such endpoint (have {ENDPOINTS})"
        elif exc.status_code == 405:
            message = f"{request.method} {request.url.path[:200]}: method not allowed (have {ENDPOINTS})"
        return error(exc.status_code, message, getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = (exc.errors() or [{}])[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        return error(422, f"{where}: {first.get('msg', 'invalid request')}")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error(500, f"internal error ({type(exc).__name__}); the service's log has the details")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(docs_page(app.openapi()))

    error_responses = {status: {"model": ErrorResponse, "description": what} for status, what in ERRORS.items()}

    def authorized(request: Request) -> bool:
        if token is None:
            return True
        got = request.headers.get("authorization", "")
        return got.startswith("Bearer ") and hmac.compare_digest(got[7:].encode(), token.encode())

    @app.get("/health", response_model=HealthResponse, summary="Whether the service is up, and what it serves")
    def health() -> dict[str, Any]:
        return {"status": "ok", "model": pkg.name, "labels": pkg.n_labels}

    @app.get("/model", summary="The package's manifest (method, labels, metrics, score) and the service's limits",
             responses={401: error_responses[401]})
    def model(request: Request) -> Any:
        if not authorized(request):
            return error(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
        return {**info, "limits": lim}

    @app.post("/predict", response_model=PredictResponse, responses=error_responses,
              summary="The top-k labels of each text",
              description=f"At most {lim['max_texts']} texts of {lim['max_chars']} characters, k in "
                          f"[1, {lim['max_k']}]. The response header X-Predict-Ms is the model's time.",
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": PredictRequest.model_json_schema()}}}})
    async def predict(request: Request) -> Any:
        if not authorized(request):
            return error(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > max_body):
            return error(413, f"request body over {max_body} bytes (at most {lim['max_texts']} texts of "
                              f"{lim['max_chars']} characters)")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body:
                return error(413, f"request body over {max_body} bytes")
        try:
            payload = json.loads(bytes(body).decode("utf-8"))
        except UnicodeDecodeError as e:
            return error(400, f"body is not valid UTF-8 (byte {e.start})")
        except (json.JSONDecodeError, RecursionError) as e:
            return error(400, f"body is not valid JSON ({getattr(e, 'msg', 'nested too deeply')})")
        except ValueError:  # an integer of more digits than Python converts (4,300)
            return error(400, "body is not valid JSON (a number with too many digits)")
        if not isinstance(payload, dict):
            return error(422, 'body must be a JSON object {"texts": [...], "k": 10}')
        unknown = sorted(set(payload) - {"texts", "k"})
        if unknown:
            return error(422, f"unknown field(s) {', '.join(unknown)} (expected texts, k)")
        texts, k = payload.get("texts"), payload.get("k", 10)
        if not isinstance(texts, list) or not texts:
            return error(422, "'texts' must be a non-empty list of strings")
        if len(texts) > lim["max_texts"]:
            return error(413, f"{len(texts)} texts in one request; at most {lim['max_texts']}")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                return error(422, f"texts[{i}] is not a string")
            if not t.strip():
                return error(422, f"texts[{i}] is empty")
            if len(t) > lim["max_chars"]:
                return error(413, f"texts[{i}] has {len(t)} characters; at most {lim['max_chars']}")
            if "\x00" in t:
                return error(422, f"texts[{i}] holds a NUL character")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= lim["max_k"]:
            shown = (json.dumps(k) if not isinstance(k, int) or abs(k) < 10**30
                     else f"an integer of {len(str(abs(k)))} digits")
            return error(422, f"'k' must be an integer in [1, {lim['max_k']}] (got {shown[:40]})")
        t0 = time.perf_counter()

        def run() -> Any:
            with model_lock:
                return pkg.predict(texts, k)

        preds = await run_in_threadpool(run)
        ms = (time.perf_counter() - t0) * 1000
        return JSONResponse({"model": pkg.name, "k": k, "predictions": [[p.to_dict() for p in row] for row in preds]},
                            headers={"X-Predict-Ms": f"{ms:.2f}"})

    return app


def serve(model: str, host: str = "127.0.0.1", port: int = 8000, limits: dict[str, int] | None = None,
          token_env: str = "XMC_SERVE_TOKEN", expect_labels: str | None = None, idle_timeout_s: float = 5.0,
          max_connections: int = 1000) -> None:
    """Load ``model`` (a package folder or registry name) and serve it until interrupted."""
    token = os.environ.get(token_env) or None
    if not is_loopback(host):
        if token is None:
            raise ConfigError(f"--host {host} is not a loopback address: set a bearer token in ${token_env} "
                              f"(at least {MIN_TOKEN_CHARS} characters) so that the service is not open to anyone")
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(f"${token_env} is shorter than {MIN_TOKEN_CHARS} characters")
    if not 0 < float(idle_timeout_s) <= 3600:
        raise ConfigError(f"--idle-timeout must be in (0, 3600] seconds (got {idle_timeout_s})")
    if not 1 <= int(max_connections) <= 1_000_000:
        raise ConfigError(f"--max-connections must be in [1, 1000000] (got {max_connections})")
    if not 0 <= int(port) <= 65535:
        raise ConfigError(f"--port must be in [0, 65535] (0: a free port; got {port})")
    pkg = load_model(model, expect_labels=expect_labels)
    pkg.predictor.warm_up()
    app = create_app(pkg, limits, token)
    # the socket is bound here, so that port 0 (the system picks a free one) is logged as the port it is
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    bound = sock.getsockname()[1]
    log.info("serving %s (%s, %d labels) on http://%s:%d%s", pkg.name, pkg.method, pkg.n_labels, host, bound,
             " (bearer token required)" if token else "")
    config = uvicorn.Config(app, log_level=os.environ.get("XMC_LOG_LEVEL", "info").lower(), access_log=True,
                            timeout_graceful_shutdown=5, http=bounded_protocol(int(max_connections)),
                            timeout_keep_alive=float(idle_timeout_s))
    uvicorn.Server(config).run(sockets=[sock])


__all__ = ["DEFAULT_LIMITS", "ErrorResponse", "HealthResponse", "LabelScore", "PredictRequest", "PredictResponse",
           "create_app", "docs_page", "is_loopback", "serve"]
