"""The HTTP token engines against protocol-faithful stand-ins of SGLang and vLLM (tests/models/
fake_engines.py): the request each sends, the ids and logprobs each reads back, the weight
version, and what each failure becomes (abort, a context error, 5xx retried, 404)."""

from __future__ import annotations

import pytest

from orchard_async.errors import ConfigError, ContextExhausted, ModelUnavailable
from orchard_async.models.tokens import Generation, GenerationAborted, Sampling, TokenEngine, make_engine
from orchard_async.models.tokens.engines import SGLangEngine, VLLMEngine
from tests.models.fake_engines import ABORT, END, GONE, OVERLOADED_ONCE, TOO_LONG, FakeServer, sample, serve

FAST = {"ORCHARD_MODEL_RETRIES": "2", "ORCHARD_MODEL_TIMEOUT": "10"}


def engines(url: str) -> list[TokenEngine]:
    sglang = SGLangEngine.from_env(url, FAST)
    vllm = VLLMEngine.from_env(url, FAST)
    for engine in (sglang, vllm):
        engine.config.backoff = 0.01
    return [sglang, vllm]


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
async def test_a_generation_comes_back_as_the_sampler_made_it(kind: str) -> None:
    server = FakeServer()
    async with serve(server) as url:
        engine = engines(url)[kind == "vllm"]
        assert isinstance(engine, TokenEngine)
        prompt = [1, 2, 3, 4]
        done = await engine.generate(prompt, Sampling(max_tokens=20, temperature=0.7, top_p=0.9))
        cut = await engine.generate(prompt, Sampling(max_tokens=3))
        await engine.close()
    ids, logprobs, finish = sample(prompt, 20, [])
    assert done == Generation(
        token_ids=ids, logprobs=logprobs, finish_reason="stop", weight_version=done.weight_version
    )
    assert done.token_ids[-1] == END and finish == "stop"
    assert cut.token_ids == ids[:3] and cut.finish_reason == "length"
    # SGLang names the weights it served; vLLM does not, so the engine's own version is used
    assert done.weight_version == ("step-3" if kind == "sglang" else "")
    body = server.received[0]
    if kind == "sglang":
        assert body["input_ids"] == prompt and body["return_logprob"] is True
        assert body["sampling_params"] == {
            "max_new_tokens": 20,
            "temperature": 0.7,
            "top_p": 0.9,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
    else:
        assert body["prompt"] == prompt and body["logprobs"] == 1 and body["max_tokens"] == 20
        assert body["return_tokens_as_token_ids"] and body["return_token_ids"]
        assert "model" not in body  # none named: vLLM serves its one model


async def test_vllm_without_return_token_ids_reads_the_token_id_names() -> None:
    server = FakeServer()
    async with serve(server) as url:
        engine = VLLMEngine.from_env(url + "/v1", {"ORCHARD_MODEL": "served"})
        engine.weight_version = "7"
        body = engine.body([5, 6], Sampling(max_tokens=8))
        assert body["model"] == "served"
        original = server.vllm_completions

        async def older_server(request):  # type: ignore[no-untyped-def]
            response = await original(request)
            import json

            data = json.loads(response.body)
            del data["choices"][0]["token_ids"]
            from aiohttp import web

            return web.json_response(data)

        server.vllm_completions = older_server  # type: ignore[method-assign]
        generation = await engine.generate([5, 6], Sampling(max_tokens=8))
        await engine.close()
    assert generation.token_ids == sample([5, 6], 8, [])[0]
    assert generation.weight_version == "7"


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
async def test_failures_are_typed_as_the_chat_clients_are(kind: str) -> None:
    server = FakeServer()
    async with serve(server) as url:
        engine = engines(url)[kind == "vllm"]
        with pytest.raises(GenerationAborted, match="aborted"):
            await engine.generate([ABORT, 1], Sampling(max_tokens=4))
        with pytest.raises(ContextExhausted):
            await engine.generate([TOO_LONG, 1], Sampling(max_tokens=4))
        with pytest.raises(ModelUnavailable, match="404"):
            await engine.generate([GONE, 1], Sampling(max_tokens=4))
        recovered = await engine.generate([OVERLOADED_ONCE, 1], Sampling(max_tokens=4))
        await engine.close()
    assert isinstance(GenerationAborted("x"), ModelUnavailable)  # infrastructure: never a reward
    assert recovered.token_ids == sample([OVERLOADED_ONCE, 1], 4, [])[0]
    assert engine.client.retries == 1  # the 503 was retried by the shared client


async def test_an_engine_that_is_not_there_is_model_unavailable() -> None:
    async with serve(FakeServer()) as url:
        pass  # the port is free again
    engine = SGLangEngine.from_env(url, {"ORCHARD_MODEL_RETRIES": "1", "ORCHARD_MODEL_TIMEOUT": "5"})
    engine.config.backoff = 0.01
    with pytest.raises(ModelUnavailable, match="gave up"):
        await engine.generate([1], Sampling())
    await engine.close()


@pytest.mark.parametrize("spec", ["sglang", "tgi:http://x", "vllm:", "transformers"])
def test_a_bad_engine_spec_is_a_config_error(spec: str) -> None:
    with pytest.raises(ConfigError, match="sglang:URL, vllm:URL or transformers:PATH"):
        make_engine(spec)


def test_engine_specs_pick_the_engine() -> None:
    assert isinstance(make_engine("sglang:http://127.0.0.1:30000", {}), SGLangEngine)
    vllm = make_engine("vllm:http://127.0.0.1:8000/v1/", {})
    assert isinstance(vllm, VLLMEngine) and vllm.url == "http://127.0.0.1:8000/v1/completions"
    with pytest.raises(ConfigError, match="no such folder"):
        make_engine("transformers:/nonexistent/model")
