"""The OpenAI-compatible chat-completions client every recipe's model policy and judge uses.

``ModelConfig`` is read from the environment in one place (``ModelConfig.from_env``;
``judge_config`` for the LLM judges), ``ChatClient`` posts with bounded concurrency and retries
(``orchard_async.kit.retry``), and what the server's failures mean is typed:

* the conversation no longer fits the model's context (an HTTP 400/413/422 whose error names
  the context length) -> ``ContextExhausted``;
* the model cannot be reached or will not serve us (401/403/404, connection refused,
  429/5xx/timeouts until the retries are spent) -> ``ModelUnavailable``, an infrastructure
  error: never a reward;
* any other rejected request -> ``ModelError``: the episode ends as ``policy_error``.

Variables (``ModelConfig.from_env``; ``ENVIRONMENT`` below declares them for docs/variables.md):

    OPENAI_BASE_URL            endpoint root, e.g. http://127.0.0.1:8000/v1 (default https://api.openai.com/v1)
    OPENAI_API_KEY             bearer token (optional for local servers)
    ORCHARD_MODEL              model name (required; OPENAI_MODEL is accepted too)
    ORCHARD_MODEL_CONCURRENCY  requests in flight at once, over all episodes (default 16)
    ORCHARD_MODEL_RETRIES      retries of 429/5xx/connection errors (default 6)
    ORCHARD_MODEL_TIMEOUT      seconds per request (default 600; never past the episode's deadline)
    ORCHARD_TEMPERATURE        sampling temperature (default: the server's)
    ORCHARD_MAX_TOKENS         completion tokens per reply (default: the server's)
    ORCHARD_TOKEN_BUDGET       total tokens per episode before it is submitted (default 1000000; 0 = none)
    ORCHARD_EXTRA_BODY         JSON object merged into every request body (e.g. {"top_p": 0.95})

Model settings are not recipe options: one model client serves every recipe's policy, its
judges and the recording proxy, and an endpoint's key does not belong on a command line. From
Python, a ``ModelConfig`` built by hand is the typed way to give them.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from orchard_async.errors import ConfigError, ContextExhausted, ModelUnavailable, OrchardError
from orchard_async.kit.retry import Attempts, Backoff, retry_after

RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
# The server will not serve this client or this model: retrying the request cannot help,
# but it is the deployment's fault, not the policy's (a wrong key, a model not loaded).
UNAVAILABLE_STATUSES = frozenset({401, 403, 404})
# Statuses servers use for "the request is too big", and the wording of the context-length
# errors of OpenAI (code context_length_exceeded), vLLM ("maximum context length is N
# tokens"), SGLang ("longer than the model's context length"), TGI ("must be <= N"),
# llama.cpp ("exceeds the available context size") and Anthropic-style proxies.
CONTEXT_STATUSES = frozenset({400, 413, 422})
CONTEXT_ERROR = re.compile(
    r"context[ _-]?(length|window|size)|maximum context|prompt is too long|too many (input )?tokens"
    r"|input is too long|tokens \+ `?max_new_tokens`? must be",
    re.IGNORECASE,
)
DEFAULT_BASE_URL = "https://api.openai.com/v1"


class ModelError(OrchardError):
    """The model endpoint rejected the request itself (a 4xx that is neither a context-length
    error nor an authentication one): the episode ends as ``policy_error``."""


def is_context_error(status: int, text: str) -> bool:
    """Whether an HTTP error says the conversation no longer fits the model's context."""
    return status in CONTEXT_STATUSES and CONTEXT_ERROR.search(text) is not None


@dataclass
class Completion:
    content: str | None  # None: the response could not be read
    usage: dict[str, int] = field(default_factory=dict)
    error: str = ""
    finish_reason: str = ""


# The variables read here (docs/variables.md): name -> (default, meaning).
ENVIRONMENT = {
    "ORCHARD_MODEL": ("(required)", "the model's name as the server knows it (OPENAI_MODEL is accepted too)"),
    "ORCHARD_MODEL_CONCURRENCY": ("16", "model requests in flight at once, over all episodes"),
    "ORCHARD_MODEL_RETRIES": ("6", "retries of 408/409/425/429/5xx answers and connection errors"),
    "ORCHARD_MODEL_TIMEOUT": ("600", "seconds per model request (never past the episode's deadline)"),
    "ORCHARD_TEMPERATURE": ("(the server's)", "sampling temperature"),
    "ORCHARD_MAX_TOKENS": ("(the server's)", "completion tokens per reply"),
    "ORCHARD_TOKEN_BUDGET": ("1000000", "total tokens per episode before it is submitted (0: no budget)"),
    "ORCHARD_EXTRA_BODY": ("{}", 'JSON object merged into every request body, e.g. {"top_p": 0.95}'),
    "ORCHARD_JUDGE_MODEL": ("(none: no judge)", "the model of the LLM judges (GUI and Claw llm_judge checks)"),
    "ORCHARD_JUDGE_BASE_URL": ("$OPENAI_BASE_URL", "the judge model's endpoint"),
    "ORCHARD_JUDGE_API_KEY": ("$OPENAI_API_KEY", "the judge model's bearer token"),
}


@dataclass
class ModelConfig:
    model: str
    base_url: str = DEFAULT_BASE_URL
    api_key: str | None = None
    max_concurrency: int = 16
    max_retries: int = 6
    request_timeout: float = 600.0
    temperature: float | None = None
    max_tokens: int | None = None
    token_budget: int = 1_000_000
    extra_body: dict[str, Any] = field(default_factory=dict)
    backoff: float = 0.5  # seconds before the first retry; doubles each time
    max_backoff: float = 30.0

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("no model name: set ORCHARD_MODEL (the name the server knows the model by)")
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"OPENAI_BASE_URL must be an http(s) URL, got {self.base_url!r}")
        if self.max_concurrency < 1 or self.max_retries < 0:
            raise ConfigError("model concurrency must be at least 1 and retries at least 0")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> ModelConfig:
        env = os.environ if environ is None else environ

        def number(name: str, kind: type, default: Any) -> Any:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                return kind(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r} is not a valid {kind.__name__}") from None

        extra_raw = env.get("ORCHARD_EXTRA_BODY", "").strip()
        try:
            extra = json.loads(extra_raw) if extra_raw else {}
        except json.JSONDecodeError as exc:
            raise ConfigError(f"ORCHARD_EXTRA_BODY is not valid JSON: {exc}") from None
        if not isinstance(extra, dict):
            raise ConfigError("ORCHARD_EXTRA_BODY must be a JSON object")
        values: dict[str, Any] = {
            "model": env.get("ORCHARD_MODEL") or env.get("OPENAI_MODEL") or "",
            "base_url": (env.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/"),
            "api_key": env.get("OPENAI_API_KEY") or None,
            "max_concurrency": number("ORCHARD_MODEL_CONCURRENCY", int, 16),
            "max_retries": number("ORCHARD_MODEL_RETRIES", int, 6),
            "request_timeout": number("ORCHARD_MODEL_TIMEOUT", float, 600.0),
            "temperature": number("ORCHARD_TEMPERATURE", float, None),
            "max_tokens": number("ORCHARD_MAX_TOKENS", int, None),
            "token_budget": number("ORCHARD_TOKEN_BUDGET", int, 1_000_000),
            "extra_body": extra,
        }
        values.update(overrides)
        return cls(**values)


def _message_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        parts = [part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text"]
        return "".join(parts) if parts else None
    return None


def parse_completion(body: bytes) -> Completion:
    """A chat-completions response body -> its text and usage (``content=None`` if unreadable)."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return Completion(None, error=f"response is not JSON ({exc}): {body[:300]!r}")
    if not isinstance(data, dict):
        return Completion(None, error=f"response is not a JSON object: {body[:300]!r}")
    usage = {}
    raw_usage = data.get("usage")
    if isinstance(raw_usage, dict):
        usage = {k: int(v) for k, v in raw_usage.items() if k.endswith("_tokens") and isinstance(v, int | float)}
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return Completion(None, usage, error=f"response has no choices: {body[:300]!r}")
    message = choices[0].get("message")
    text = _message_text(message.get("content")) if isinstance(message, dict) else None
    if text is None:
        return Completion(None, usage, error=f"choices[0].message has no text content: {body[:300]!r}")
    return Completion(text, usage, finish_reason=str(choices[0].get("finish_reason") or ""))


class ChatClient:
    """Chat completions over HTTP with bounded concurrency and retries (httpx)."""

    def __init__(self, config: ModelConfig):
        self.config = config
        self.url = f"{config.base_url.rstrip('/')}/chat/completions"
        self._client: Any = None
        self._limit: anyio.Semaphore | None = None
        self._loop: object = None
        self.requests = 0  # HTTP requests sent, retries included
        self.retries = 0

    def _bind(self) -> tuple[Any, anyio.Semaphore]:
        """The HTTP client and the concurrency limit of the running event loop."""
        try:
            import httpx
        except ImportError:
            raise ConfigError("the openai policy needs httpx: pip install httpx") from None
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            headers = {"Content-Type": "application/json"}
            if self.config.api_key:
                headers["Authorization"] = f"Bearer {self.config.api_key}"
            limits = httpx.Limits(
                max_connections=self.config.max_concurrency, max_keepalive_connections=self.config.max_concurrency
            )
            self._client = httpx.AsyncClient(headers=headers, limits=limits, trust_env=False)
            self._limit = anyio.Semaphore(self.config.max_concurrency)
            self._loop = loop
        assert self._limit is not None
        return self._client, self._limit

    def body(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.config.model, "messages": messages}
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        if self.config.max_tokens is not None:
            body["max_tokens"] = self.config.max_tokens
        body.update(self.config.extra_body)
        return body

    async def complete(self, messages: list[dict[str, Any]], *, time_left: float | None = None) -> Completion:
        response, retries = await self.send(self.body(messages), time_left=time_left)
        completion = parse_completion(response.content)
        if retries:
            completion.usage["retries"] = retries
        return completion

    async def send(
        self, body: dict[str, Any], *, time_left: float | None = None, url: str | None = None
    ) -> tuple[Any, int]:
        """One request body posted until the server accepts it: (its 2xx/3xx ``httpx.Response``,
        the retries it took). 429/5xx/connection errors are retried with the config's backoff
        (or after the server's Retry-After) while retries and ``time_left`` (the config's
        ``request_timeout`` when not given) last; what no retry can help raises at once.
        ``url``: another endpoint of the same server (the token engines' ``/generate`` and
        ``/completions``); the chat-completions URL by default."""
        import httpx

        url = url or self.url
        client, limit = self._bind()
        payload = json.dumps(body).encode()
        attempts = Attempts(
            Backoff(self.config.backoff, cap=self.config.max_backoff, jitter=(0.5, 1.0)),
            most=self.config.max_retries + 1,
            deadline=time.monotonic() + (time_left if time_left and time_left > 0 else self.config.request_timeout),
            clock=time.monotonic,
        )
        while True:
            asked: float | None = None
            timeout = max(1.0, min(self.config.request_timeout, attempts.time_left()))
            async with limit:
                self.requests += 1
                try:
                    response = await client.post(url, content=payload, timeout=timeout)
                except httpx.TransportError as exc:  # connection refused/reset, timeouts
                    last = f"{type(exc).__name__}: {exc}"
                else:
                    if response.status_code < 400:
                        return response, attempts.failures
                    status = response.status_code
                    last = f"HTTP {status}: {response.text[:500]}"
                    if is_context_error(status, response.text):
                        raise ContextExhausted(f"{url} answered {last}")
                    if status in UNAVAILABLE_STATUSES:
                        raise ModelUnavailable(f"{url} answered {last}")
                    if status not in RETRY_STATUSES:
                        raise ModelError(f"{url} answered {last}")
                    asked = retry_after(response.headers.get("retry-after"))
            pause = attempts.next_pause(asked)
            if pause is None:
                if attempts.out_of_time:
                    raise ModelUnavailable(
                        f"{url}: no time left to retry after {attempts.failures} attempts; last error: {last}"
                    )
                raise ModelUnavailable(f"{url}: gave up after {attempts.failures} attempts; last error: {last}")
            self.retries += 1
            await anyio.sleep(pause)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def judge_config(environ: Mapping[str, str] | None = None) -> ModelConfig:
    """The LLM judges' model: ``ORCHARD_JUDGE_*``, the rest as ``ModelConfig.from_env``."""
    env = os.environ if environ is None else environ
    model = env.get("ORCHARD_JUDGE_MODEL", "")
    if not model:
        raise ConfigError(
            "an llm_judge check needs a judge model: set ORCHARD_JUDGE_MODEL (and ORCHARD_JUDGE_BASE_URL)"
        )
    mapped = {
        **env,
        "ORCHARD_MODEL": model,
        "OPENAI_BASE_URL": env.get("ORCHARD_JUDGE_BASE_URL") or env.get("OPENAI_BASE_URL", ""),
        "OPENAI_API_KEY": env.get("ORCHARD_JUDGE_API_KEY") or env.get("OPENAI_API_KEY", ""),
    }
    return ModelConfig.from_env(mapped)


def judge_config_if_set(environ: Mapping[str, str] | None = None) -> ModelConfig | None:
    """``judge_config``, or None when no judge model is set (for checks that are skipped without one)."""
    env = os.environ if environ is None else environ
    return judge_config(env) if env.get("ORCHARD_JUDGE_MODEL") else None
