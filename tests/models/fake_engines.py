"""Protocol-faithful stand-ins for SGLang's native ``/generate`` and vLLM's OpenAI-compatible
``/v1/completions``, written from their documented request and response shapes (aiohttp,
on the loopback, in the test's event loop). Their "model" is a deterministic function of the
prompt, so a test knows what each turn must return; a prompt's first token selects a failure
(``ABORT``, ``TOO_LONG``, ``OVERLOADED_ONCE``, ``GONE``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

ABORT, TOO_LONG, OVERLOADED_ONCE, GONE = 9001, 9002, 9003, 9004
END = 7  # the fake model's end-of-sequence id


def sample(prompt: list[int], max_new: int, stop_ids: list[int]) -> tuple[list[int], list[float], str]:
    """The fake model: token i continues the prompt's sum; it ends with END after 5 tokens."""
    ids: list[int] = []
    logprobs: list[float] = []
    base = sum(prompt)
    for i in range(max_new):
        token = END if i == 5 else 10 + (base + i) % 50
        ids.append(token)
        logprobs.append(-0.01 * (i + 1) - (token % 3) * 0.5)
        if token == END or token in stop_ids:
            return ids, logprobs, "stop"
    return ids, logprobs, "length"


class FakeServer:
    def __init__(self, weight_version: str = "step-3") -> None:
        self.received: list[dict[str, Any]] = []
        self.weight_version = weight_version
        self.overloaded = 0

    def failure(self, first: int) -> web.Response | None:
        if first == TOO_LONG:
            text = "The input (40000 tokens) is longer than the model's context length (32768 tokens)."
            return web.json_response({"error": {"message": text}}, status=400)
        if first == GONE:
            return web.json_response({"error": {"message": "model not found"}}, status=404)
        if first == OVERLOADED_ONCE and self.overloaded == 0:
            self.overloaded += 1
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        return None

    async def sglang_generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.received.append(body)
        ids = body["input_ids"]
        if (failed := self.failure(ids[0])) is not None:
            return failed
        params = body.get("sampling_params", {})
        if ids[0] == ABORT:
            finish: dict[str, Any] = {"type": "abort", "message": "Abort before prefill"}
            out, logprobs = [], []
        else:
            out, logprobs, kind = sample(ids, params.get("max_new_tokens", 128), params.get("stop_token_ids") or [])
            finish = {"type": kind, "matched": out[-1]} if kind == "stop" else {"type": kind}
        meta: dict[str, Any] = {
            "id": f"req-{len(self.received)}",
            "finish_reason": finish,
            "prompt_tokens": len(ids),
            "completion_tokens": len(out),
            "cached_tokens": 0,
            "weight_version": self.weight_version,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, token, None] for lp, token in zip(logprobs, out, strict=True)]
        return web.json_response({"text": " ".join(map(str, out)), "output_ids": out, "meta_info": meta})

    async def vllm_completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.received.append(body)
        prompt = body["prompt"]
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            return web.json_response({"error": {"message": "this fake takes token prompts only"}}, status=400)
        if (failed := self.failure(prompt[0])) is not None:
            return failed
        if prompt[0] == ABORT:
            out, logprobs, finish = [], [], "abort"
        else:
            out, logprobs, finish = sample(prompt, body.get("max_tokens") or 16, body.get("stop_token_ids") or [])
        as_ids = body.get("return_tokens_as_token_ids")
        choice: dict[str, Any] = {
            "index": 0,
            "text": " ".join(map(str, out)),
            "finish_reason": finish,
            "stop_reason": None,
            "logprobs": None,
        }
        if body.get("logprobs") is not None:
            names = [f"token_id:{t}" if as_ids else f"tok{t}" for t in out]
            choice["logprobs"] = {
                "text_offset": list(range(len(out))),
                "token_logprobs": logprobs,
                "tokens": names,
                "top_logprobs": [{name: lp} for name, lp in zip(names, logprobs, strict=True)],
            }
        if body.get("return_token_ids"):
            choice["token_ids"] = out
            choice["prompt_token_ids"] = prompt
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(out), "total_tokens": len(prompt) + len(out)}
        return web.json_response(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "model": body.get("model", "served"),
                "choices": [choice],
                "usage": usage,
            }
        )


@asynccontextmanager
async def serve(server: FakeServer) -> AsyncIterator[str]:
    """Both engines' routes on one loopback port; yields the server's root URL."""
    app = web.Application()
    app.router.add_post("/generate", server.sglang_generate)
    app.router.add_post("/v1/completions", server.vllm_completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
