"""Token engines: token ids in, token ids and the sampler's logprobs out.

An RL trainer needs the exact tokens its sampler produced and their logprobs; a chat
endpoint gives text that the trainer would have to re-tokenize (which drifts). A
``TokenEngine`` is the one small protocol a token-in/token-out policy samples through::

    generation = await engine.generate(input_ids, Sampling(max_tokens=256))
    generation.token_ids, generation.logprobs, generation.finish_reason, generation.weight_version

Engines (``make_engine("KIND:WHERE")``, the CLI's ``--engine``):

* ``sglang:URL``: SGLang's native ``/generate`` (``engines.SGLangEngine``);
* ``vllm:URL``: vLLM's OpenAI-compatible ``/v1/completions`` with a token prompt
  (``engines.VLLMEngine``);
* ``transformers:PATH``: a Hugging Face model folder run in this process on the CPU
  (``local.TransformersEngine``; the ``tokens`` extra), for tests, CPU users and the
  logprob parity check.

The HTTP engines post through the chat client's ``ChatClient.send`` (its concurrency limit,
retries and error mapping): an engine that cannot be reached or will not serve us is
``ModelUnavailable``, a prompt too long for the model ``ContextExhausted``. A generation the
server aborted (``finish_reason`` ``abort``) raises ``GenerationAborted``, an infrastructure
error: an aborted sample is never data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import msgspec

from orchard_async.errors import ConfigError, ModelUnavailable

EXTRA_HINT = "pip install -e '.[tokens]'"  # the extra that brings transformers, tokenizers and torch


class Sampling(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How to sample one turn. None: the engine's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop_token_ids: list[int] = []  # besides the model's own end-of-sequence tokens


class Generation(msgspec.Struct, kw_only=True):
    """One sampled turn: the tokens as the sampler produced them and its logprob of each."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (an end token or a stop id), "length", "abort"
    weight_version: str = ""

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")


class GenerationAborted(ModelUnavailable):
    """The engine aborted the generation (SGLang/vLLM ``finish_reason`` ``abort``: a request
    cancelled by the trainer, or dropped across a weight update). Never data."""


@runtime_checkable
class TokenEngine(Protocol):
    """Samples a continuation of ``input_ids``. ``weight_version`` is the version of the
    weights it serves as far as it knows (the server's own word, when it says).

    ``input_ids`` is any sequence of ints (the token policy passes a compact ``array('i')``,
    not a list): an engine that keeps it past the call copies it (``list(input_ids)``)."""

    name: str
    weight_version: str

    async def generate(self, input_ids: Sequence[int], sampling: Sampling) -> Generation: ...

    async def close(self) -> None: ...


ENGINE_KINDS = ("sglang", "vllm", "transformers")


def make_engine(spec: str, environ: Mapping[str, str] | None = None) -> TokenEngine:
    """An engine from ``KIND:WHERE`` (``sglang:URL``, ``vllm:URL``, ``transformers:PATH``).
    The HTTP engines take the model client's settings (concurrency, retries, timeout, key)
    from the environment, as ``ModelConfig.from_env`` reads them."""
    kind, sep, where = spec.partition(":")
    if not sep or kind not in ENGINE_KINDS or not where:
        raise ConfigError(f"--engine {spec!r}: give sglang:URL, vllm:URL or transformers:PATH")
    if kind == "transformers":
        from orchard_async.models.tokens.local import TransformersEngine

        return TransformersEngine(where)
    from orchard_async.models.tokens.engines import SGLangEngine, VLLMEngine

    return SGLangEngine.from_env(where, environ) if kind == "sglang" else VLLMEngine.from_env(where, environ)


__all__ = [
    "ENGINE_KINDS",
    "EXTRA_HINT",
    "Generation",
    "GenerationAborted",
    "Sampling",
    "TokenEngine",
    "make_engine",
]
