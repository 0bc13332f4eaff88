"""``heart serve``: an OpenAI-compatible chat-completions server over the role runtime.

The model name of a request selects the role: ``planner``, ``router``, ``primitive``,
``verifier`` (each served by its LoRA adapter, or by the base when it has none) or ``base``
(every adapter off). Concurrent requests go through the batching scheduler, so clients that
call at the same time share one mixed-adapter batch. ``response_format`` json_schema is
honoured with constrained decoding; ``usage`` counts real tokens; each response names the
adapter that answered (``heart_adapter``, an extra field the ``openai`` client keeps).

    heart serve --model smollm2-135m --adapter planner=runs/a/planner ... [--port 8000] [--quantize int8]
    heart run --env bfcl --task multi_turn_base_0 --model openai:http://127.0.0.1:8000/v1#role

Binds 127.0.0.1 unless told otherwise (there is no authentication). Bad requests get a 4xx
with an OpenAI-shaped error naming what is wrong: an unknown model (404), malformed JSON,
bad sampling parameters, streaming or n > 1, a prompt over the token limit (400).
FastAPI + uvicorn: request validation is pydantic's, served from a thread pool.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from heart import ROLES
from heart.runtime.base import Backend, SamplingConfig

BASE_MODEL = "base"
"""Model name that asks for the base with every adapter off."""


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class JsonSchemaFormat(BaseModel):
    name: str = "answer"
    schema_: dict[str, Any] = Field(alias="schema")


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatRequest(BaseModel):
    """The part of OpenAI's chat-completions request this server honours; other fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=1)
    stream: Literal[False] = False
    response_format: ResponseFormat | None = None
    continue_final_message: bool = False
    """vLLM's extension: continue a final assistant message (a prefilled answer)."""
    add_generation_prompt: bool = True


class ServeConfig(BaseModel):
    """Limits of one server."""

    max_prompt_tokens: int = 8192
    """Longer prompts are refused with 400 (before any decoding)."""
    max_new_tokens: int = 2048
    """The largest ``max_tokens`` a request may ask for."""
    default_new_tokens: int = 512
    """``max_tokens`` when the request gives none."""


def _error(status: int, message: str, param: str | None = None, code: str | None = None):
    from fastapi.responses import JSONResponse

    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse(status_code=status, content={"error": {
        "message": message, "type": kind, "param": param, "code": code}})


def build_app(backend: Backend, adapters: list[str], count_tokens: Callable[[list[dict]], int],
              config: ServeConfig = ServeConfig()):
    """The FastAPI app serving ``backend``; ``adapters`` are the roles that have one."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError

    app = FastAPI(title="heart serve", description=__doc__.split("\n")[0])
    models = [*ROLES, BASE_MODEL]
    created = int(time.time())

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        if first.get("type") == "json_invalid":
            return _error(400, f"the request body is not valid JSON: {first.get('msg')}", code="json_invalid")
        return _error(400, f"{where or 'body'}: {first.get('msg')} (got {first.get('input')!r:.200})",
                      param=where or None)

    @app.get("/v1/models")
    def list_models():
        return {"object": "list", "data": [{"id": m, "object": "model", "created": created, "owned_by": "heart",
                                            "adapter": m if m in adapters else None} for m in models]}

    @app.post("/v1/chat/completions")
    def chat(request: ChatRequest):
        if request.model not in models:
            return _error(404, f"model {request.model!r} is not served here; models are {models} "
                               "(the model name selects the role)", param="model", code="model_not_found")
        max_tokens = (request.max_completion_tokens or request.max_tokens
                      or min(config.default_new_tokens, config.max_new_tokens))
        if max_tokens > config.max_new_tokens:
            return _error(400, f"max_tokens={max_tokens} exceeds this server's limit of {config.max_new_tokens}",
                          param="max_tokens")
        messages = [m.model_dump() for m in request.messages]
        if request.continue_final_message != (messages[-1]["role"] == "assistant"):
            if request.continue_final_message:
                return _error(400, "continue_final_message needs a final assistant message",
                              param="continue_final_message")
            # An assistant message last without continue_final_message: the client wants a
            # new turn after it; the runtime continues a final assistant message, so refuse.
            return _error(400, "the last message is the assistant's: pass continue_final_message=true to "
                               "continue it", param="messages")
        n_prompt = count_tokens(messages)
        if n_prompt > config.max_prompt_tokens:
            return _error(400, f"the prompt has {n_prompt} tokens; this server's limit is "
                               f"{config.max_prompt_tokens}", param="messages", code="context_length_exceeded")
        guided = None
        if request.response_format is not None:
            if request.response_format.type == "json_schema":
                if request.response_format.json_schema is None:
                    return _error(400, "response_format json_schema needs a 'json_schema' object",
                                  param="response_format")
                guided = json.dumps(request.response_format.json_schema.schema_)
            elif request.response_format.type == "json_object":
                guided = json.dumps({"type": "object"})
        sampling = SamplingConfig(max_new_tokens=max_tokens, temperature=request.temperature,
                                  top_p=request.top_p, seed=request.seed, guided_json=guided)
        try:
            # "base" is a role with no adapter: the runtime serves it with every adapter off.
            generation = backend.generate(request.model, messages, sampling)
        except Exception as err:  # an infrastructure failure: say so, as a 500
            return _error(500, f"{type(err).__name__}: {err}")
        finish = "length" if generation.completion_tokens >= max_tokens else "stop"
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": generation.text},
                         "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": generation.prompt_tokens, "completion_tokens": generation.completion_tokens,
                      "total_tokens": generation.prompt_tokens + generation.completion_tokens},
            "heart_adapter": generation.adapter,
            "heart_backend": generation.backend,
        }

    return app


def token_counter(backend) -> Callable[[list[dict]], int]:
    """Prompt tokens as the model will see them (chat template included), or words without a tokenizer."""
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:
        return lambda messages: sum(len(m["content"].split()) for m in messages)

    def count(messages: list[dict]) -> int:
        return len(tokenizer(backend.render(messages), add_special_tokens=False)["input_ids"])

    return count


def serve(args) -> int:
    """``heart serve``: load the runtime, then run uvicorn until interrupted."""
    import sys

    import uvicorn

    from heart.runtime.backends import backend_for
    from heart.runtime.scheduler import BatchingBackend

    from heart.access import RequireKey, api_key_for

    key = api_key_for(args.host, args.api_key, "heart serve")  # refused before any model loads
    adapters = dict(args.adapters)
    # the same model strings and engines as every command; a bad one is a UserError naming it
    inner = backend_for(args.model, adapters, args.engine, max_batch_size=args.max_batch_size,
                        quantize=args.quantize)
    backend = BatchingBackend(inner, max_batch_size=args.max_batch_size, max_wait_s=0.02)
    config = ServeConfig(max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=args.max_new_tokens)
    app = build_app(backend, list(adapters), token_counter(inner), config)
    if key:
        app = RequireKey(app, key)
    print(f"heart serve: {inner.name} with adapters {sorted(adapters) or 'none'} on "
          f"http://{args.host}:{args.port}/v1 (models: {', '.join([*ROLES, BASE_MODEL])}"
          f"{'; API key required' if key else ''})", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
