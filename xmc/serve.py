"""The HTTP service of one model package (FastAPI + uvicorn).

    POST /predict  {"texts": ["..."], "k": 10}  -> {"model", "k", "predictions": [[{label, uid, text, score}]]}
    GET  /health   -> {"status": "ok", "model", "labels"}
    GET  /model    -> the package manifest (without its file list)

Loopback by default. Bound to any other address it requires a bearer token (``Authorization: Bearer ...``,
taken from an environment variable, never from the command line). Every limit (texts per request,
characters per text, k, body size) is answered with a 4xx and a one-line message.
"""

# no `from __future__ import annotations`: FastAPI reads the endpoints' annotations (Request) at definition

import hmac
import ipaddress
import json
import logging
import os
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from xmc.errors import ConfigError
from xmc.package.registry import load_model

log = logging.getLogger("xmc.serve")

DEFAULT_LIMITS = {"max_texts": 256, "max_chars": 10_000, "max_k": 1000, "batch_size": 256}
MIN_TOKEN_CHARS = 16


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
                  version=str(pkg.manifest.get("code", {}).get("xmc", "")), docs_url="/docs", redoc_url=None)
    info = pkg.info()

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    def authorized(request: Request) -> bool:
        if token is None:
            return True
        got = request.headers.get("authorization", "")
        return got.startswith("Bearer ") and hmac.compare_digest(got[7:].encode(), token.encode())

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "model": pkg.name, "labels": pkg.n_labels}

    @app.get("/model")
    def model(request: Request) -> Any:
        if not authorized(request):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        return {**info, "limits": lim}

    @app.post("/predict")
    async def predict(request: Request) -> Any:
        if not authorized(request):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
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
            return error(422, f"'k' must be an integer in [1, {lim['max_k']}] (got {json.dumps(k)[:40]})")
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
          token_env: str = "XMC_SERVE_TOKEN", expect_labels: str | None = None) -> None:
    """Load ``model`` (a package folder or registry name) and serve it until interrupted."""
    token = os.environ.get(token_env) or None
    if not is_loopback(host):
        if token is None:
            raise ConfigError(f"--host {host} is not a loopback address: set a bearer token in ${token_env} "
                              f"(at least {MIN_TOKEN_CHARS} characters) so that the service is not open to anyone")
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(f"${token_env} is shorter than {MIN_TOKEN_CHARS} characters")
    if not 1 <= int(port) <= 65535:
        raise ConfigError(f"--port must be in [1, 65535] (got {port})")
    pkg = load_model(model, expect_labels=expect_labels)
    pkg.predictor.warm_up()
    app = create_app(pkg, limits, token)
    log.info("serving %s (%s, %d labels) on http://%s:%d%s", pkg.name, pkg.method, pkg.n_labels, host, port,
             " (bearer token required)" if token else "")
    uvicorn.run(app, host=host, port=int(port), log_level=os.environ.get("XMC_LOG_LEVEL", "info").lower(),
                access_log=True, timeout_graceful_shutdown=5)


__all__ = ["DEFAULT_LIMITS", "create_app", "is_loopback", "serve"]
