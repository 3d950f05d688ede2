"""The HTTP server: FastAPI routes over a TokenizerManager (the scheduler runs in its own
process), served by uvicorn.

Native routes live here; the OpenAI-compatible ones in `openai/`. Every error, whatever
raised it, answers `{"error": {"message", "type", "code"}}`, and a bad request never reaches
the scheduler, so it cannot disturb the requests being served.
"""

from __future__ import annotations

import hmac
import logging
import os
import signal
import sys
import threading
from types import FrameType

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.entrypoints.health import health, health_generate
from sglang_aux.srt.entrypoints.http_limits import (
    CLOSE_AFTER,
    BodyLimitMiddleware,
    bounded_http_protocol,
    default_body_limit,
    peer,
)
from sglang_aux.srt.entrypoints.openai.api_error import CLIENT_CLOSED_REQUEST, APIError, error_body
from sglang_aux.srt.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    parse_body,
)
from sglang_aux.srt.entrypoints.openai.serving_base import (
    await_results,
    event_stream,
    served_model_name,
    submit_samples,
)
from sglang_aux.srt.entrypoints.openai.serving_chat import create_chat_completion
from sglang_aux.srt.entrypoints.openai.serving_completions import create_completion
from sglang_aux.srt.entrypoints.server_info import model_info, render_metrics, server_info
from sglang_aux.srt.managers.request_output import logprob_meta_info
from sglang_aux.srt.managers.scheduler.tp_ranks import run_follower_node
from sglang_aux.srt.managers.tokenizer.request_stream import StreamDelta
from sglang_aux.srt.managers.tokenizer.scheduler_handle import SchedulerGone
from sglang_aux.srt.managers.tokenizer.tokenizer_manager import TokenizerManager
from sglang_aux.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

# answered without an API key (liveness probes, as SGLang)
OPEN_PATHS = frozenset({"/health", "/health_generate"})
GENERATION_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
DEFAULT_GIL_SWITCH_INTERVAL = "0.0005"
SCHEDULER_EXIT_CODE = 1  # the scheduler process died: the server exits with this
UVICORN_STARTUP_FAILURE = 3  # uvicorn.run's status when it cannot start


class ApiKeyMiddleware:
    """401 unless the request carries `Authorization: Bearer <api key>`. Checked before the
    body is read, so an unauthenticated client learns nothing about its request."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = Headers(scope=scope).get("authorization", "").encode()
            if not hmac.compare_digest(given, self.expected):
                response = JSONResponse(error_body(401, "invalid or missing API key"),
                                        status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def respond(out: dict | StreamingResponse) -> JSONResponse | StreamingResponse:
    """A generation's answer. Its dict holds JSON types only, so it is sent as is: FastAPI's
    encoder would walk every output id again on the event loop."""
    return out if isinstance(out, StreamingResponse) else JSONResponse(out)


def create_app(server: TokenizerManager) -> FastAPI:
    """The app serving `server` (started: its scheduler process is ready)."""
    app = FastAPI(title="sglang_aux", docs_url=None, redoc_url=None)
    args = server.server_args
    app.add_middleware(BodyLimitMiddleware, read_timeout_s=args.timeout_request_read,
                       max_bytes=args.max_request_body_bytes
                       or default_body_limit(server.spec.limits.max_prompt_chars))
    if args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=args.api_key)

    def error(request: Request, status: int, message: str) -> JSONResponse:
        rejected = status < 500 and status != CLIENT_CLOSED_REQUEST  # aborts count apart
        if rejected and request.url.path in GENERATION_PATHS:
            server.metrics.add(requests_total=1, requests_failed=1)
        headers = {"connection": "close"} if status in CLOSE_AFTER else None
        return JSONResponse(error_body(status, message), status_code=status, headers=headers)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return error(request, exc.status, exc.message)

    @app.exception_handler(SchedulerGone)
    async def scheduler_gone(request: Request, exc: SchedulerGone) -> JSONResponse:
        return error(request, 503, str(exc))

    @app.exception_handler(ClientDisconnect)
    async def client_disconnected(request: Request, exc: ClientDisconnect) -> Response:
        # one line, not a traceback: nobody is left to answer
        client = peer(request.client and (request.client.host, request.client.port))
        logger.info("%s: disconnected while sending its request to %s", client,
                    request.url.path)
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises after answering, so uvicorn still logs the traceback
        return error(request, 500, f"internal error: {exc!r}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error(request, exc.status_code, str(exc.detail))

    @app.get("/health")
    async def health_route() -> JSONResponse:
        return health(server)

    @app.get("/health_generate")
    async def health_generate_route() -> JSONResponse:
        return await health_generate(server)

    @app.get("/get_model_info")
    async def get_model_info() -> dict:
        return model_info(server.spec)

    @app.get("/get_server_info")
    async def get_server_info() -> dict:
        return server_info(server, await server.engine_info())

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> dict:
        """SGLang's route: empty the prefix cache, only while no request runs or waits."""
        freed = await server.flush_cache()
        if freed is None:
            raise APIError(400, "cache not flushed: requests are running or waiting; retry "
                                "when the server is idle")
        what = ("the prefix cache is disabled" if not server.spec.radix_cache
                else f"freed {freed} cached KV slots")
        return {"success": True, "freed_tokens": freed, "message": f"Cache flushed: {what}."}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(render_metrics(server, await server.engine_info()),
                                 media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": served_model_name(server), "object": "model", "owned_by": "sglang_aux",
            "root": server.server_args.model_path,
            "max_model_len": server.spec.context_len,
        }]}

    @app.post("/generate", response_model=None)
    async def generate(request: Request) -> JSONResponse | StreamingResponse:
        """SGLang's native generation: one prompt (a dict answers), a batch of prompts or
        `n` > 1 samples (a list answers, prompt-major). As SGLang, each streamed event carries
        the whole text and token ids so far, or with `--incremental-streaming-output` only the
        new ones (logprob entries too, as SGLang); the last event of each request carries its
        full meta_info."""
        body = await parse_body(request, GenerateRequest)
        streams = []
        for item in body.items():
            n = (item["sampling_params"] or {}).get("n") or 1
            streams += await submit_samples(server, {k: item[k] for k in ("text", "input_ids")
                                                     if item.get(k) is not None},
                                            item["sampling_params"], n, item["rid"],
                                            item["logprob"])
        if not body.stream:
            outs = await await_results(server, streams, request)
            return JSONResponse(outs if body.is_batch or len(outs) > 1 else outs[0])
        incremental = server.server_args.incremental_streaming_output
        texts, ids = [""] * len(streams), [[] for _ in streams]  # so far, per stream

        def chunks(index: int, delta: StreamDelta) -> list[dict]:
            stream = streams[index]
            meta = delta.output["meta_info"] if delta.output is not None else {
                "id": stream.rid, "prompt_tokens": stream.prompt_tokens,
                "completion_tokens": stream.completion_tokens, "finish_reason": None}
            if delta.output is None and delta.logprobs is not None:
                meta.update(delta.logprobs if incremental
                            else logprob_meta_info(server.tokenizer, stream.req))
            if incremental:
                chunk = {"text": delta.text, "output_ids": delta.output_ids, "meta_info": meta}
            else:
                texts[index] += delta.text
                ids[index].extend(delta.output_ids)
                chunk = {"text": texts[index], "output_ids": list(ids[index]), "meta_info": meta}
            return [chunk if len(streams) == 1 else {**chunk, "index": index}]

        return StreamingResponse(event_stream(server, streams, chunks),
                                 media_type="text/event-stream")

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> JSONResponse | StreamingResponse:
        body = await parse_body(request, CompletionRequest)
        return respond(await create_completion(server, body, request))

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> JSONResponse | StreamingResponse:
        body = await parse_body(request, ChatCompletionRequest)
        return respond(await create_chat_completion(server, body, request))

    return app


def gil_switch_interval() -> float:
    """Seconds a thread waiting for the GIL lets the holder run Python before asking for it:
    the front end's reader thread, which hands each step's tokens to the event loop, shares
    the GIL with it, and Python's default (5 ms) is several whole steps of a small model,
    during which streams wait. The environment's
    SGLANG_AUX_GIL_SWITCH_INTERVAL (seconds) overrides it, for A/B measurements."""
    value = os.environ.get("SGLANG_AUX_GIL_SWITCH_INTERVAL", DEFAULT_GIL_SWITCH_INTERVAL)
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"SGLANG_AUX_GIL_SWITCH_INTERVAL must be a positive number of "
                         f"seconds, got {value!r}")
    return seconds


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def serve_follower_node(server_args: ServerArgs) -> int:
    """A node past the first (`--node-rank` > 0) serves no HTTP: it runs its tensor-parallel
    ranks, which follow rank 0 on node 0, until they end; their exit code."""
    return run_follower_node(server_args, Engine)


def launch_server(server_args: ServerArgs) -> None:
    """Build the Engine in the scheduler process, then serve HTTP until interrupted (the
    scheduler process is stopped on the way out). If the scheduler process dies, the requests
    in flight fail, the server stops and this raises SystemExit(SCHEDULER_EXIT_CODE), so a
    supervisor sees it and restarts it."""
    if server_args.node_rank > 0:
        raise SystemExit(serve_follower_node(server_args))
    sys.setswitchinterval(gil_switch_interval())
    # uvicorn answers SIGTERM with a graceful shutdown, then raises it again: unwind then, as
    # on Ctrl-C, so that the scheduler process is stopped below instead of left to notice
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    server = TokenizerManager(server_args, Engine)
    spec = server.start()
    app = create_app(server)
    logger.info("Serving %s on http://%s:%d (device %s, speculative %s, scheduler pid %d)",
                spec.server_args.model_path, server_args.host, server_args.port,
                spec.device, server_args.speculative_algorithm, spec.pid)
    # uvicorn's per-request access lines only at debug: the scheduler logs its own
    # C HTTP parser (httptools, bounded by http_limits) and event loop: less Python per
    # request on the front end
    http = uvicorn.Server(uvicorn.Config(
        app, host=server_args.host, port=server_args.port,
        http=bounded_http_protocol(server_args.max_request_head_bytes,
                                   server_args.timeout_request_read),
        timeout_keep_alive=server_args.timeout_keep_alive,
        loop="asyncio" if sys.platform == "win32" else "uvloop",
        log_level=server_args.log_level.lower(),
        access_log=server_args.log_level.lower() == "debug"))

    scheduler_died = threading.Event()

    def scheduler_exited() -> None:  # the reader thread, once every request has failed
        logger.error("stopping the server: its scheduler process is gone")
        scheduler_died.set()
        http.should_exit = True  # uvicorn's main loop polls it

    server.on_scheduler_exit = scheduler_exited
    try:
        http.run()
    finally:
        server.shutdown()
    if scheduler_died.is_set():
        raise SystemExit(SCHEDULER_EXIT_CODE)
    if not http.started:  # as uvicorn.run: the socket could not be bound
        raise SystemExit(UVICORN_STARTUP_FAILURE)
