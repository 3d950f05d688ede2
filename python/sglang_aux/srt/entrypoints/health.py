"""Health routes: `/health` says whether the scheduler process is up (503 from the moment it
exits); SGLang's `/health_generate` runs a one-token generation through it, so a scheduler
that is up but stuck answers 503 too, once the generation has taken too long."""

from __future__ import annotations

import asyncio

from fastapi.responses import JSONResponse

from sglang_aux.srt.entrypoints.openai.api_error import error_body
from sglang_aux.srt.managers.tokenizer.request_stream import RequestFailed
from sglang_aux.srt.managers.tokenizer.scheduler_handle import SchedulerGone
from sglang_aux.srt.managers.tokenizer.tokenizer_manager import TokenizerManager

HEALTH_CHECK_TIMEOUT_S = 20.0  # SGLang's default for /health_generate
HEALTH_CHECK_REQUEST = {"input_ids": [0],
                        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
SCHEDULER_GONE = "the scheduler process exited; this server cannot run requests any more"
HEALTHY = {"status": "ok"}


def unhealthy(reason: str) -> JSONResponse:
    return JSONResponse(error_body(503, reason), status_code=503)


def health(server: TokenizerManager) -> JSONResponse:
    return JSONResponse(HEALTHY) if server.alive else unhealthy(SCHEDULER_GONE)


async def health_generate(server: TokenizerManager,
                          timeout_s: float = HEALTH_CHECK_TIMEOUT_S) -> JSONResponse:
    if not server.alive:
        return unhealthy(SCHEDULER_GONE)
    try:
        stream = await server.submit(**HEALTH_CHECK_REQUEST)
        await asyncio.wait_for(stream.result(), timeout_s)
    except (SchedulerGone, RequestFailed) as e:
        return unhealthy(str(e))
    except TimeoutError:
        server.abort(stream.rid)
        return unhealthy(f"the health check's one-token generation took over {timeout_s:g} s")
    return JSONResponse(HEALTHY)
