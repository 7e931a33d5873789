"""The HTTP token engines: SGLang's native ``/generate`` and vLLM's OpenAI-compatible
``/v1/completions`` with a token prompt.

Both post through ``ChatClient.send`` (the model client's concurrency limit, retries and
error mapping, one owner of them) and read back the sampled ids with one logprob each.

SGLang (``POST /generate``)::

    {"input_ids": [...], "sampling_params": {"max_new_tokens": N, "temperature": T, ...,
     "skip_special_tokens": false, "no_stop_trim": true}, "return_logprob": true}
    -> {"text": ..., "output_ids": [...], "meta_info": {"finish_reason": {"type": "stop" | "length"
        | "abort", ...}, "output_token_logprobs": [[logprob, token_id, text|null], ...],
        "weight_version": "..."}}

vLLM (``POST /v1/completions``)::

    {"model": M, "prompt": [ids], "max_tokens": N, "logprobs": 1, "return_tokens_as_token_ids": true,
     "return_token_ids": true, "skip_special_tokens": false, "include_stop_str_in_output": true}
    -> {"choices": [{"finish_reason": "stop" | "length" | "abort", "token_ids": [...],
        "logprobs": {"tokens": ["token_id:42", ...], "token_logprobs": [...]}}]}

vLLM names no weight version in its answer: the engine's ``weight_version`` (set by whoever
syncs the weights) tags its turns.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from orchard_async.models.client import ChatClient, ModelConfig, ModelError
from orchard_async.models.tokens import Generation, GenerationAborted, Sampling


def _config(url: str, environ: Mapping[str, str] | None, fallback_model: str) -> tuple[ModelConfig, bool]:
    """The model client's settings for an engine at ``url``; whether a model name was given."""
    env = os.environ if environ is None else environ
    named = env.get("ORCHARD_MODEL") or env.get("OPENAI_MODEL") or ""
    return ModelConfig.from_env(env, base_url=url.rstrip("/"), model=named or fallback_model), bool(named)


def _answer(response: Any, url: str) -> dict[str, Any]:
    try:
        data = json.loads(response.content)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ModelError(f"{url} answered something that is not JSON: {response.content[:300]!r}") from None
    if not isinstance(data, dict):
        raise ModelError(f"{url} answered {type(data).__name__}, not a JSON object: {response.content[:300]!r}")
    return data


class SGLangEngine:
    """SGLang's native ``/generate`` with ``input_ids``."""

    def __init__(self, config: ModelConfig):
        self.config = config
        self.client = ChatClient(config)
        self.url = f"{config.base_url}/generate"
        self.name = f"sglang:{config.base_url}"
        self.weight_version = ""

    @classmethod
    def from_env(cls, url: str, environ: Mapping[str, str] | None = None) -> SGLangEngine:
        return cls(_config(url, environ, "sglang")[0])

    def body(self, input_ids: Sequence[int], sampling: Sampling) -> dict[str, Any]:
        params: dict[str, Any] = {"skip_special_tokens": False, "no_stop_trim": True}
        if sampling.max_tokens is not None:
            params["max_new_tokens"] = sampling.max_tokens
        for key in ("temperature", "top_p", "top_k"):
            value = getattr(sampling, key)
            if value is not None:
                params[key] = value
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        if sampling.stop_token_ids:
            params["stop_token_ids"] = list(sampling.stop_token_ids)
        return {"input_ids": list(input_ids), "sampling_params": params, "return_logprob": True}

    async def generate(self, input_ids: Sequence[int], sampling: Sampling) -> Generation:
        response, _ = await self.client.send(self.body(input_ids, sampling), url=self.url)
        data = _answer(response, self.url)
        meta = data.get("meta_info")
        if not isinstance(meta, dict):
            raise ModelError(f"{self.url}: the answer has no meta_info: {response.content[:300]!r}")
        finish = meta.get("finish_reason")
        kind = finish.get("type") if isinstance(finish, dict) else finish
        if kind == "abort":
            message = finish.get("message", "") if isinstance(finish, dict) else ""
            raise GenerationAborted(f"{self.url} aborted the generation{': ' + message if message else ''}")
        pairs = meta.get("output_token_logprobs")
        if not isinstance(pairs, list):
            raise ModelError(f"{self.url}: no output_token_logprobs in meta_info (was return_logprob ignored?)")
        try:
            logprobs = [float(entry[0]) for entry in pairs]
            token_ids = [int(entry[1]) for entry in pairs]
        except (TypeError, ValueError, IndexError):
            raise ModelError(f"{self.url}: output_token_logprobs is not [[logprob, token_id, text], ...]") from None
        version = meta.get("weight_version")
        return Generation(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=str(kind or ""),
            weight_version=str(version) if version is not None else self.weight_version,
        )

    async def close(self) -> None:
        await self.client.close()


class VLLMEngine:
    """vLLM's OpenAI-compatible ``/v1/completions`` with the prompt as token ids."""

    def __init__(self, config: ModelConfig, *, send_model: bool = True):
        self.config = config
        self.client = ChatClient(config)
        root = config.base_url
        self.url = f"{root}/completions" if root.endswith("/v1") else f"{root}/v1/completions"
        self.name = f"vllm:{root}"
        self.send_model = send_model  # vLLM serves its one model when the request names none
        self.weight_version = ""

    @classmethod
    def from_env(cls, url: str, environ: Mapping[str, str] | None = None) -> VLLMEngine:
        config, named = _config(url, environ, "vllm")
        return cls(config, send_model=named)

    def body(self, input_ids: Sequence[int], sampling: Sampling) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": list(input_ids),
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
        }
        if self.send_model:
            body["model"] = self.config.model
        if sampling.max_tokens is not None:
            body["max_tokens"] = sampling.max_tokens
        for key in ("temperature", "top_p", "top_k", "seed"):
            value = getattr(sampling, key)
            if value is not None:
                body[key] = value
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        return body

    async def generate(self, input_ids: Sequence[int], sampling: Sampling) -> Generation:
        response, _ = await self.client.send(self.body(input_ids, sampling), url=self.url)
        data = _answer(response, self.url)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ModelError(f"{self.url}: the answer has no choices: {response.content[:300]!r}")
        choice = choices[0]
        finish = str(choice.get("finish_reason") or "")
        if finish == "abort":
            raise GenerationAborted(f"{self.url} aborted the generation")
        logprobs_of = choice.get("logprobs")
        if not isinstance(logprobs_of, dict) or not isinstance(logprobs_of.get("token_logprobs"), list):
            raise ModelError(f"{self.url}: the choice has no logprobs.token_logprobs (was logprobs ignored?)")
        token_ids = choice.get("token_ids")
        if not isinstance(token_ids, list):  # a server without return_token_ids: the "token_id:N" names
            token_ids = [_token_id(name, self.url) for name in logprobs_of.get("tokens") or []]
        try:
            ids = [int(token) for token in token_ids]
            logprobs = [float(value) for value in logprobs_of["token_logprobs"]]
        except (TypeError, ValueError):
            raise ModelError(f"{self.url}: token_ids or token_logprobs hold something that is not a number") from None
        if len(ids) != len(logprobs):
            raise ModelError(f"{self.url}: {len(ids)} token ids but {len(logprobs)} logprobs")
        return Generation(token_ids=ids, logprobs=logprobs, finish_reason=finish, weight_version=self.weight_version)

    async def close(self) -> None:
        await self.client.close()


def _token_id(name: Any, url: str) -> int:
    """``token_id:42`` (vLLM's ``return_tokens_as_token_ids``) -> 42."""
    if isinstance(name, str) and name.startswith("token_id:"):
        try:
            return int(name.removeprefix("token_id:"))
        except ValueError:
            pass
    raise ModelError(f"{url}: a token is named {name!r}, not token_id:N (is return_tokens_as_token_ids honoured?)")
