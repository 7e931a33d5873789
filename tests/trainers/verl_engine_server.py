"""A rollout server as verl's replicas are one: a Ray actor whose ``generate(request_id,
prompt_ids, sampling_params, image_data, video_data)`` returns verl's ``TokenOutput`` (as
vLLM's and SGLang's server actors in verl.workers.rollout do), here over the token path's
in-process transformers engine on the tiny model. Wrapped with ``ray.remote`` where it is
made, as verl wraps its load balancer."""

from __future__ import annotations

from typing import Any


class TinyEngineServer:
    def __init__(self, model: str, global_steps: int):
        from orchard_async.models.tokens.local import TransformersEngine

        self.engine = TransformersEngine(model)
        self.global_steps = global_steps
        self.requests: list[tuple[str, list[int]]] = []

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **_: Any,
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        from orchard_async.models.tokens import Sampling

        self.requests.append((request_id, list(prompt_ids)))
        sampling = Sampling(max_tokens=sampling_params["max_tokens"], temperature=sampling_params["temperature"])
        generation = await self.engine.generate(list(prompt_ids), sampling)
        # verl's servers report the weights' step as ``global_steps``; its client turns that
        # into the min/max the agent loop reads.
        return TokenOutput(
            token_ids=generation.token_ids,
            log_probs=generation.logprobs,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    def seen(self) -> list[tuple[str, list[int]]]:
        return self.requests
