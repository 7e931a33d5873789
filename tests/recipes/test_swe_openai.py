"""The OpenAI-compatible policy over real HTTP, against a local server playing scripted replies."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import anyio
import pytest

import orchard_async as oa
from orchard_async.models.client import ChatClient, ModelConfig, is_context_error, parse_completion
from orchard_async.recipes import swe
from orchard_async.recipes.swe.openai_policy import OpenAIPolicy
from tests.recipes.swe_support import Reply, assistant_turns, chat_reply, run_rollout

REPRO = "python3 -c \"from textkit import slugify; print(slugify('Crème Brûlée'))\""

# What the model "says" at each turn, by the number of its replies so far in the conversation.
SCRIPT = [
    # 0: no bash block at all: a format error, and the episode goes on
    "Let me think about where slugify lives before doing anything.",
    # 1: look at the code
    "THOUGHT: Find the normalisation step.\n\n```bash\ngrep -n normalize textkit/slug.py\n```",
    # 2: reproduce
    f"THOUGHT: Reproduce the bug.\n\n```bash\n{REPRO}\n```",
    # 3: fix with sed and check in one command
    "THOUGHT: NFC keeps accents composed, so the ASCII step drops them; NFKD decomposes them.\n\n"
    f'```bash\nsed -i \'s/normalize("NFC", text)/normalize("NFKD", text)/\' textkit/slug.py && {REPRO}\n```',
    # 4: done
    "THOUGHT: The slug is right now.\n\n```bash\nsubmit\n```",
]


def model(server, **overrides) -> OpenAIPolicy:
    config = ModelConfig(
        model="scripted-swe",
        base_url=server.base_url,
        api_key="test-key",
        backoff=0.01,
        request_timeout=20,
        **overrides,
    )
    return OpenAIPolicy(config)


def test_multi_turn_episode_fixes_a_bundled_bug_over_http(chat_server, tmp_path):
    def handler(request, index):
        if index == 0:  # the endpoint is busy: the client must back off and retry
            return Reply(429, {"error": {"message": "rate limited"}}, headers={"Retry-After": "0"})
        if index == 3:  # a response without a message: recorded as a malformed step
            return Reply(200, {"id": "x", "choices": []})
        return chat_reply(SCRIPT[assistant_turns(request)], prompt_tokens=100 + index, completion_tokens=10)

    server = chat_server(handler)
    tasks = swe.load_tasks("builtin:textkit__1")
    policy = model(server)

    async def go():
        async with policy:
            return await run_rollout(tasks, policy, tmp_path / "sbx", concurrency=1)

    run = anyio.run(go)
    (trajectory,) = run.trajectories
    assert run.leaked == [] and run.left_on_disk == []
    assert trajectory.status == "finished" and trajectory.end_reason == "submitted", trajectory.error
    assert trajectory.success and trajectory.reward == 1.0, trajectory.info.get("test_output_tail")
    assert 'normalize("NFKD", text)' in trajectory.info["patch"]
    assert trajectory.policy == "openai:scripted-swe"

    kinds = [step.action.kind for step in trajectory.steps]
    assert kinds == ["invalid", "exec", "invalid", "exec", "exec", "submit"]
    format_error, _, malformed, repro, fix, _ = trajectory.steps
    assert "exactly one ```bash block" in format_error.action.error and format_error.action.raw == SCRIPT[0]
    assert format_error.observation.startswith("error: ")
    assert "malformed response" in malformed.action.error and malformed.action.raw == ""
    assert "crme-brle" in repro.observation and repro.exit_code == 0
    assert "creme-brulee" in fix.observation

    # token usage is recorded per step; the 429 shows as a retry of the first request
    assert format_error.action.usage == {
        "prompt_tokens": 101,
        "completion_tokens": 10,
        "total_tokens": 111,
        "retries": 1,
    }
    assert sum(step.action.usage.get("total_tokens", 0) for step in trajectory.steps) > 0

    # what went over the wire
    assert len(server.requests) == 7  # 429 + 6 answered
    first = server.requests[1]
    assert first["headers"]["authorization"] == "Bearer test-key"
    assert first["json"]["model"] == "scripted-swe"
    assert [m["role"] for m in first["json"]["messages"]] == ["system", "user"]
    assert "slugify()" in first["json"]["messages"][1]["content"]
    second = server.requests[2]["json"]["messages"]
    assert second[-2] == {"role": "assistant", "content": SCRIPT[0]}
    assert second[-1]["role"] == "user" and second[-1]["content"].startswith("Format error:")
    # the malformed response left no empty assistant turn: the retry asks the same question
    assert server.requests[4]["json"]["messages"] == server.requests[3]["json"]["messages"]
    last = server.requests[-1]["json"]["messages"]
    assert "<returncode>0</returncode>" in last[-1]["content"] and "creme-brulee" in last[-1]["content"]

    # the SFT export reproduces the conversation the model saw, plus the final reply
    record = swe.export.sft_record(trajectory)
    assert record["messages"][:-1] == last
    assert record["messages"][-1] == {"role": "assistant", "content": SCRIPT[4]}
    assert record["usage"]["retries"] == 1


async def test_retries_on_429_and_5xx_then_gives_up(chat_server):
    statuses = [429, 503, 500]
    server = chat_server(lambda request, index: Reply(statuses[index]) if index < 3 else chat_reply("```bash\nls\n```"))
    client = ChatClient(ModelConfig(model="m", base_url=server.base_url, backoff=0.01, max_retries=3))
    try:
        completion = await client.complete([{"role": "user", "content": "hi"}])
        assert completion.content == "```bash\nls\n```" and completion.usage["retries"] == 3
        assert client.retries == 3 and len(server.requests) == 4

        failing = chat_server(lambda request, index: Reply(503, {"error": "overloaded"}))
        client2 = ChatClient(ModelConfig(model="m", base_url=failing.base_url, backoff=0.01, max_retries=2))
        with pytest.raises(oa.ModelUnavailable, match="gave up after 3 attempts.*503"):
            await client2.complete([{"role": "user", "content": "hi"}])
        await client2.close()
        assert len(failing.requests) == 3
    finally:
        await client.close()


async def test_a_rejected_request_is_not_retried_and_ends_the_episode_as_policy_error(chat_server, tmp_path):
    server = chat_server(lambda request, index: Reply(400, {"error": {"message": "Unknown parameter: 'top_q'"}}))
    policy = model(server)
    async with policy:
        run = await run_rollout(swe.load_tasks("builtin:minicalc__4"), policy, tmp_path / "sbx")
    (trajectory,) = run.trajectories
    assert trajectory.status == "failed" and trajectory.end_reason == "policy_error"
    assert "HTTP 400" in trajectory.error and "top_q" in trajectory.error
    assert len(server.requests) == 1 and run.left_on_disk == []


async def test_concurrent_requests_are_bounded(chat_server):
    server = chat_server(lambda request, index: Reply(body=chat_reply("```bash\ntrue\n```").body, delay=0.05))
    client = ChatClient(ModelConfig(model="m", base_url=server.base_url, max_concurrency=2))
    try:
        async with anyio.create_task_group() as group:
            for _ in range(6):
                group.start_soon(client.complete, [{"role": "user", "content": "go"}])
    finally:
        await client.close()
    assert len(server.requests) == 6
    assert server.max_in_flight == 2


async def test_token_budget_submits(chat_server):
    server = chat_server(
        lambda request, index: chat_reply("```bash\nls\n```", prompt_tokens=400, completion_tokens=100)
    )
    policy = model(server, token_budget=1000)
    task = swe.load_tasks("builtin:minicalc__4")[0]
    history = []
    async with policy:
        for step in range(3):
            action = await policy.act(oa.Observation("e", task, "fix it", step, history, 60.0))
            history.append(oa.Step(index=step, action=action, observation="ok", exit_code=0))
    assert [s.action.kind for s in history] == ["exec", "exec", "submit"]
    assert "token budget spent (1000 of 1000" in history[-1].action.error
    assert len(server.requests) == 2


def test_parse_completion_variants():
    ok = parse_completion(
        b'{"choices":[{"message":{"content":"hi"},"finish_reason":"length"}],"usage":{"total_tokens":5}}'
    )
    assert ok.content == "hi" and ok.usage == {"total_tokens": 5} and ok.finish_reason == "length"
    parts = parse_completion(
        b'{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}}]}'
    )
    assert parts.content == "ab"
    for body, message in [
        (b"not json", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"choices": []}', "no choices"),
        (b'{"choices": [{"message": {"content": null}}]}', "no text content"),
    ]:
        bad = parse_completion(body)
        assert bad.content is None and message in bad.error


def test_config_from_env():
    config = ModelConfig.from_env(
        {
            "OPENAI_BASE_URL": "http://127.0.0.1:9/v1/",
            "OPENAI_API_KEY": "k",
            "ORCHARD_MODEL": "qwen",
            "ORCHARD_MODEL_CONCURRENCY": "3",
            "ORCHARD_TEMPERATURE": "0.7",
            "ORCHARD_EXTRA_BODY": '{"top_p": 0.9}',
        }
    )
    assert (config.base_url, config.api_key, config.model, config.max_concurrency) == (
        "http://127.0.0.1:9/v1",
        "k",
        "qwen",
        3,
    )
    assert ChatClient(config).body([])["top_p"] == 0.9 and ChatClient(config).body([])["temperature"] == 0.7
    with pytest.raises(oa.ConfigError, match="ORCHARD_MODEL"):
        ModelConfig.from_env({})
    with pytest.raises(oa.ConfigError, match="ORCHARD_MODEL_RETRIES"):
        ModelConfig.from_env({"ORCHARD_MODEL": "m", "ORCHARD_MODEL_RETRIES": "many"})
    with pytest.raises(oa.ConfigError, match="ORCHARD_EXTRA_BODY"):
        ModelConfig.from_env({"ORCHARD_MODEL": "m", "ORCHARD_EXTRA_BODY": "[1]"})


# -- what the server's failures do to the episode ----------------------------------------------

VLLM_CONTEXT_ERROR = {
    "object": "error",
    "message": "This model's maximum context length is 8192 tokens. However, you requested 9013 tokens "
    "(8013 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
    "type": "BadRequestError",
    "code": 400,
}
FIX_AND_CHECK = SCRIPT[3]  # the sed that fixes textkit__1, then the reproduction


def cut_off_reply(content: str, completion_tokens: int) -> Reply:
    """A reply the server stopped early (``finish_reason: length``)."""
    body = chat_reply(content, completion_tokens=completion_tokens).body
    body["choices"][0]["finish_reason"] = "length"
    return Reply(body=body)


@pytest.mark.parametrize("exhaustion", ["http_400", "cut_off_reply"])
async def test_context_exhaustion_ends_the_episode_and_it_is_scored(chat_server, tmp_path, exhaustion):
    """The fix is already in the tree when the context runs out: the episode is scored
    (resolved), not thrown away and not blamed on the policy."""

    def handler(request, index):
        if assistant_turns(request) == 0:
            return chat_reply(FIX_AND_CHECK)
        if exhaustion == "http_400":
            return Reply(400, VLLM_CONTEXT_ERROR)
        return cut_off_reply("THOUGHT: Now let me carefully re-read every file in the repository, starting", 7)

    server = chat_server(handler)
    policy = model(server)  # no max_tokens of ours: a cut-off reply was cut by the context
    async with policy:
        run = await run_rollout(swe.load_tasks("builtin:textkit__1"), policy, tmp_path / "sbx")
    (trajectory,) = run.trajectories
    assert trajectory.status == "finished" and trajectory.end_reason == "context_exhausted", trajectory.error
    assert trajectory.retries == [] and len(server.requests) == 2  # not retried: retrying cannot make it fit
    assert trajectory.info["resolved"] is True and trajectory.reward == 1.0, trajectory.info.get("test_output_tail")
    assert [step.action.kind for step in trajectory.steps] == ["exec"]
    # scored, finished episodes are training data: the exports keep it
    (record,) = swe.export.sft_records([trajectory])
    assert record["end_reason"] == "context_exhausted" and record["messages"][-1]["role"] == "assistant"


async def test_a_reply_cut_by_our_own_max_tokens_is_a_format_error(chat_server):
    """With ``max_tokens`` set and reached, the model wrote too much in one reply: it is told
    so and goes on (the context still has room)."""
    server = chat_server(lambda request, index: cut_off_reply("THOUGHT: " + "very long musing " * 20, 64))
    policy = model(server, max_tokens=64)
    task = swe.load_tasks("builtin:minicalc__4")[0]
    async with policy:
        action = await policy.act(oa.Observation("e", task, "fix it", 0, [], 60.0))
        assert action.kind == "invalid" and "cut off at the token limit" in action.error
        # the same cut, short of our cap, is the context's: nothing more can be said
        short = chat_server(lambda request, index: cut_off_reply("THOUGHT: I will", 3))
        policy.client.url = f"{short.base_url}/chat/completions"
        with pytest.raises(oa.ContextExhausted, match="context is full"):
            await policy.act(oa.Observation("e", task, "fix it", 0, [], 60.0))


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (400, "This model's maximum context length is 4096 tokens. However, your messages resulted in 5000 tokens."),
        (400, "{'code': 'context_length_exceeded'}"),
        (400, "The input (9000 tokens) is longer than the model's context length (8192 tokens)."),
        (422, "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 + 200"),
        (400, "the request exceeds the available context size, try increasing it"),
        (413, "prompt is too long: 210000 tokens > 200000 maximum"),
    ],
)
def test_context_length_errors_of_known_servers_are_recognised(status, message):
    assert is_context_error(status, json.dumps({"error": {"message": message}}))


@pytest.mark.parametrize(
    ("status", "message"),
    [(400, "Unknown parameter: 'top_q'"), (429, "too many requests"), (500, "context length exceeded")],
)
def test_other_errors_are_not_context_errors(status, message):
    assert not is_context_error(status, message)


@pytest.mark.parametrize("status", [401, 403])
async def test_auth_errors_are_model_unavailable_retried_and_never_exported(chat_server, tmp_path, status):
    server = chat_server(lambda request, index: Reply(status, {"error": {"message": "Incorrect API key provided"}}))
    policy = model(server)
    async with policy:
        run = await run_rollout(swe.load_tasks("builtin:minicalc__4"), policy, tmp_path / "sbx")
    (trajectory,) = run.trajectories
    assert trajectory.status == "failed" and trajectory.end_reason == "model_unavailable"
    # the engine retried the episode (each attempt one request: an auth error is not retried in place)
    assert [retry.reason for retry in trajectory.retries] == ["model_unavailable"] * 3
    assert len(server.requests) == 3 and f"HTTP {status}" in trajectory.error
    assert run.leaked == [] and run.left_on_disk == []
    assert_never_exported([trajectory], tmp_path)


async def test_server_errors_until_the_retries_are_spent_are_model_unavailable(chat_server, tmp_path):
    server = chat_server(lambda request, index: Reply(500, {"error": {"message": "CUDA out of memory"}}))
    policy = model(server, max_retries=1)
    async with policy:
        run = await run_rollout(swe.load_tasks("builtin:minicalc__4"), policy, tmp_path / "sbx")
    (trajectory,) = run.trajectories
    assert trajectory.status == "failed" and trajectory.end_reason == "model_unavailable"
    assert len(trajectory.retries) == 3 and "gave up after 2 attempts" in trajectory.error
    assert "CUDA out of memory" in trajectory.error
    assert len(server.requests) == 3 * 2  # three episode attempts of two requests each
    assert_never_exported([trajectory], tmp_path)


async def test_a_server_that_is_down_is_model_unavailable():
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    client = ChatClient(ModelConfig(model="m", base_url=f"http://127.0.0.1:{port}/v1", backoff=0.01, max_retries=2))
    try:
        with pytest.raises(oa.ModelUnavailable, match="gave up after 3 attempts.*ConnectError"):
            await client.complete([{"role": "user", "content": "hi"}])
    finally:
        await client.close()
    assert client.requests == 3


def assert_never_exported(trajectories, tmp_path):
    sft = swe.export.export_sft(trajectories, tmp_path / "sft.jsonl", min_reward=0.0)  # every reward
    rl = swe.export.export_rl(trajectories, tmp_path / "rl.jsonl")
    for summary in (sft, rl):
        assert (summary.records, summary.episodes, summary.skipped) == (0, 0, len(trajectories))
        assert summary.skipped_reasons == {"model_unavailable": len(trajectories)}
        assert Path(summary.path).read_text() == ""
