"""A Hugging Face causal LM run in this process (CPU), as a token engine.

For tests, for CPU users and for the logprob parity check: the logprob it records for a
token is ``log_softmax(logits / temperature)`` at that position (temperature 1 by default:
the model's own distribution, what a trainer recomputes), with the KV cache of the same
forward passes a full recomputation does. One generation at a time (the model is one
object); each runs in a worker thread so the event loop keeps serving the other episodes.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from orchard_async.errors import ConfigError, ContextExhausted
from orchard_async.models.tokens import EXTRA_HINT, Generation, Sampling

DEFAULT_MAX_TOKENS = 128


def load_transformers() -> tuple[Any, Any]:
    """(torch, transformers), or a ConfigError naming the extra to install."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ConfigError(f"the transformers engine needs {exc.name}: {EXTRA_HINT}") from None
    transformers.utils.logging.disable_progress_bar()  # a bar per load on stderr is noise in a run's log
    return torch, transformers


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer (with its chat template) saved in a model folder."""
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(f"tokenizer {folder}: no such folder (give a Hugging Face model or tokenizer folder)")
    _, transformers = load_transformers()
    try:
        return transformers.AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"tokenizer {folder}: {exc}") from None


class TransformersEngine:
    """``transformers:PATH``: the model folder's weights, in float32 on the CPU."""

    def __init__(self, path: str | Path, *, seed: int = 0, weight_version: str = "0"):
        folder = Path(path)
        if not folder.is_dir():
            raise ConfigError(f"--engine transformers:{folder}: no such folder (give a Hugging Face model folder)")
        torch, transformers = load_transformers()
        try:
            self.model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--engine transformers:{folder}: {exc}") from None
        self.path = folder
        self.name = f"transformers:{folder}"
        self.weight_version = weight_version
        self.torch = torch
        self.generator = torch.Generator().manual_seed(seed)
        self.context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = getattr(self.model.config, "eos_token_id", None)
        self.end_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
        self._lock = threading.Lock()
        # transformers 5 renamed the KV cache argument and output (past_key_values -> cache)
        self._cache_name = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"

    async def generate(self, input_ids: Sequence[int], sampling: Sampling) -> Generation:
        if sampling.top_p is not None or sampling.top_k is not None:
            raise ConfigError(
                "the transformers engine samples from the whole distribution: leave top_p and top_k unset"
            )
        return await anyio.to_thread.run_sync(self._generate, list(input_ids), sampling)

    async def continue_with(self, input_ids: Sequence[int], continuation: Sequence[int]) -> Generation:
        """The generation that samples exactly ``continuation`` after ``input_ids``: its
        logprobs (temperature 1) computed as sampling computes them, token by token on the KV
        cache. For tests and scripted replies whose logprobs must still be the model's."""
        forced = list(continuation)
        return await anyio.to_thread.run_sync(self._generate, list(input_ids), Sampling(max_tokens=len(forced)), forced)

    def _generate(self, input_ids: list[int], sampling: Sampling, forced: list[int] | None = None) -> Generation:
        torch = self.torch
        if not input_ids:
            raise ConfigError("an empty prompt: a generation needs at least one input token")
        room = self.context - len(input_ids) if self.context else DEFAULT_MAX_TOKENS
        if room <= 0:
            raise ContextExhausted(f"the prompt has {len(input_ids)} tokens; the model's context is {self.context}")
        budget = min(room, sampling.max_tokens if sampling.max_tokens is not None else DEFAULT_MAX_TOKENS)
        temperature = 1.0 if sampling.temperature is None else sampling.temperature
        stops = self.end_ids | frozenset(sampling.stop_token_ids)
        generator = self.generator if sampling.seed is None else torch.Generator().manual_seed(sampling.seed)
        token_ids: list[int] = []
        logprobs: list[float] = []
        finish = "length"
        with self._lock, torch.inference_mode():
            out = self.model(torch.tensor([input_ids]), use_cache=True)
            for _ in range(budget):
                logits = out.logits[0, -1].float()
                if forced is not None:
                    scores = torch.log_softmax(logits, dim=-1)
                    token = forced[len(token_ids)]
                elif temperature > 0:
                    scores = torch.log_softmax(logits / temperature, dim=-1)
                    token = int(torch.multinomial(scores.exp(), 1, generator=generator))
                else:  # greedy: the logprob of the model's own distribution
                    scores = torch.log_softmax(logits, dim=-1)
                    token = int(scores.argmax())
                token_ids.append(token)
                logprobs.append(float(scores[token]))
                if token in stops:
                    finish = "stop"
                    break
                cache = {self._cache_name: getattr(out, self._cache_name)}
                out = self.model(torch.tensor([[token]]), use_cache=True, **cache)
        return Generation(
            token_ids=token_ids, logprobs=logprobs, finish_reason=finish, weight_version=self.weight_version
        )

    async def close(self) -> None:
        return None
