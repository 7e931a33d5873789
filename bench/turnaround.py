"""`bench turnaround`: is the environment ever what a trainer's sampler waits for?

Each level runs N concurrent episodes of S steps (the synthetic ``StepsTask``) against a fake
engine that answers every request after a fixed latency, twice in one run:

* ``tokens``: the token policy (``TokenPolicy``: the context rebuilt from the steps' records,
  the observation's tokens from the chat template's delta, ids and logprobs kept per turn),
  with a byte-level tokenizer (ChatML template) so no model package is needed;
* ``messages``: the message path: the same conversation rebuilt as chat messages each turn,
  the reply parsed, nothing recorded but the text.

Measured per level and path: the environment's turnaround, from the engine's reply to the
same episode's next request (p50/p99: parsing, the step, the command on the adapter, the
next prompt), and the rollout's steps/s against the ideal of ``concurrency / latency`` (an
environment that costs nothing), twice:

* one wave (``of_ideal``): N episodes that all start at once and end together, as a
  synchronous trainer's batch. Its run also pays each episode's start (create, setup, first
  prompt) back to back on one loop before the last one asks, and every end in the last period;
* sustained (``sustained_of_ideal``): ``waves`` x N episodes with N in flight throughout, a
  new one started as one ends, as an asynchronous trainer keeps its sampler fed: the rate
  ``concurrency / latency`` is, by Little's law, a steady state's, and this run amortises the
  one start and one end over ``waves`` waves while still paying every episode's own.

``comparisons`` hold tokens against messages: the cost of recording tokens.

With ``--processes N`` each path runs as a ``ProcessRollout`` of N worker processes (one event
loop each, its own fake engine): the row's numbers are all the workers' and the caller's, its
time from when every worker was ready. The floor stays one loop's.

Targets (issue 24): p50 <= 1 ms on sim at 1,024 concurrent episodes; throughput within 10%
of concurrency / latency; token recording <= 5% of the message path's steps/s.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import re
import time
from collections.abc import AsyncIterable, Iterator, Sequence
from typing import Any

import anyio
import msgspec

from orchard_async import Action, Observation, ProcessRollout, Trajectory, Workload, get_adapter, rollout
from orchard_async.bench.report import Row, compare_rows, ms_percentiles
from orchard_async.bench.scenario import Outcome
from orchard_async.bench.tasks import steps_tasks
from orchard_async.models.tokens import Generation, Sampling
from orchard_async.models.tokens.policy import TokenPolicy, bash_reply
from orchard_async.records.trajectory import episode_so_far

REPLY = "THOUGHT: once more.\n\n```bash\ntrue\n```"
SYSTEM = "You are an agent in a Linux shell: reply with one command in a ```bash block."


def bench_messages(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The synthetic task's chat: what a shell agent would be shown."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": trajectory.instruction}]
    for step in trajectory.steps:
        messages.append({"role": "assistant", "content": step.action.raw})
        messages.append({"role": "user", "content": step.observation or f"(exit status {step.exit_code})"})
    return messages


class ByteTokenizer:
    """One id per UTF-8 byte (ids 0-255) and ChatML's specials: the shape of a Hugging Face
    tokenizer as the token policy uses it, so no model package is needed.

    It costs less than a real one: a token-policy turn of this bench's episodes takes about
    16 us with it and about 60 us with the tests' Hugging Face tokenizer (tokenizers' Rust
    BPE, a jinja ChatML template; 85 us before the policy called the Rust tokenizer
    directly), measured 2026-12-05 on this bench's 2 cores. This bench's token-path numbers
    are the environment's own work; a real tokenizer adds its ~45 us a turn on top (see the
    Token path section of docs/performance.md)."""

    SPECIAL = {"<|im_start|>": 256, "<|im_end|>": 257}
    NAMES = {v: k for k, v in SPECIAL.items()}
    SPLIT = re.compile("(<\\|im_start\\|>|<\\|im_end\\|>)")
    chat_template = "chatml"
    eos_token_id = 257

    def apply_chat_template(
        self, messages: list[dict[str, Any]], *, tokenize: bool, add_generation_prompt: bool
    ) -> str:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        ids: list[int] = []
        for part in self.SPLIT.split(text):
            special = self.SPECIAL.get(part)
            if special is not None:
                ids.append(special)
            elif part:
                ids += part.encode()
        return {"input_ids": ids}

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        out, start = [], 0
        for index, token in enumerate(ids):
            if token >= 256:
                out.append(bytes(ids[start:index]).decode(errors="replace"))
                if not skip_special_tokens:
                    out.append(self.NAMES[token])
                start = index + 1
        out.append(bytes(ids[start:]).decode(errors="replace"))
        return "".join(out)


def steady_share(latency: float, periods: Sequence[float]) -> float | None:
    """The engine's latency over the mean time between an episode's consecutive requests
    (None before any episode asked twice): the share of the ideal rate an episode keeps
    once it runs, without each episode's start and end (its create, setup and first
    prompt; its scoring and close) that a run's steps/s also pays. 1 when the
    environment's turnaround and the loop's lateness in resuming an episode cost nothing."""
    if not periods:
        return None
    return latency / (sum(periods) / len(periods))


class FixedLatencyEngine:
    """Answers after ``latency`` seconds, always with ``REPLY``; records, per episode (the
    asking task), when each reply went out and how long until the next request came."""

    name = "fixed-latency"
    weight_version = "0"

    def __init__(self, latency: float, tokenizer: ByteTokenizer):
        self.latency = latency
        self.reply_ids = [*tokenizer(REPLY)["input_ids"], tokenizer.eos_token_id]
        self.logprobs = [-0.5] * len(self.reply_ids)
        self.replied: dict[int, float] = {}  # task id -> when its last reply went out
        self.last_asked: dict[int, float] = {}  # task id -> when it last asked
        self.first_asks: list[float] = []  # when each episode first asked, in order
        self.periods: list[float] = []  # the time between an episode's consecutive requests
        self.turnarounds: list[float] = []
        self.cpu_at_first_ask = time.process_time()  # this process's CPU clock when the first request came

    async def _answer(self) -> None:
        # the asking episode's task: asyncio's own lookup, a dict read (anyio's get_current_task
        # builds a TaskInfo per call, a few us of this process's CPU per step that is the
        # bench's bookkeeping, not the environment's)
        try:
            task = id(asyncio.current_task())
        except RuntimeError:  # not on asyncio
            task = anyio.get_current_task().id
        asked = time.monotonic()
        last = self.replied.pop(task, None)
        if last is not None:
            self.turnarounds.append(asked - last)
            self.periods.append(asked - self.last_asked[task])
        elif task not in self.last_asked:
            if not self.first_asks:
                self.cpu_at_first_ask = time.process_time()
            self.first_asks.append(asked)
        self.last_asked[task] = asked
        await anyio.sleep(self.latency)
        self.replied[task] = time.monotonic()

    def steady_of_ideal(self) -> float | None:
        return steady_share(self.latency, self.periods)

    def records(self, cpu_s: float, gc_pauses: list[float], leaked: int = 0) -> Records:
        """What this engine recorded, with the CPU and the collector's pauses of its process."""
        return Records(
            turnarounds=self.turnarounds,
            periods=self.periods,
            first_asks=self.first_asks,
            cpu_s=cpu_s,
            gc_pauses=gc_pauses,
            leaked=leaked,
        )

    async def generate(self, input_ids: Sequence[int], sampling: Sampling) -> Generation:
        await self._answer()
        return Generation(token_ids=self.reply_ids, logprobs=self.logprobs, finish_reason="stop", weight_version="0")

    async def chat(self, messages: list[dict[str, Any]]) -> str:
        await self._answer()
        return REPLY

    async def close(self) -> None:
        return None


class MessagePolicy:
    """The message path: the conversation rebuilt each turn, one chat call, the reply parsed."""

    name = "messages"

    def __init__(self, engine: FixedLatencyEngine):
        self.engine = engine

    async def act(self, observation: Observation) -> Action:
        messages = bench_messages(episode_so_far(observation.episode_id, observation.instruction, observation.history))
        return bash_reply(await self.engine.chat(messages))


async def _engine_floor(concurrency: int, steps: int, latency: float, waves: int = 1) -> Row:
    """The same engine, number of episodes and steps, and event loop, with no environment:
    ``concurrency`` tasks, each asking the engine ``steps`` times back to back for each of
    its ``waves`` episodes. What an environment that cost nothing would get on this loop: the
    ideal's ``concurrency / latency`` is out of its reach (a timer wakes the loop up to a
    millisecond late, and each task costs its spawn)."""
    engine = FixedLatencyEngine(latency, ByteTokenizer())

    async def episode() -> None:
        for _ in range(steps * waves):
            await engine.chat([])

    started = time.monotonic()
    with collector_pauses() as pauses:
        async with anyio.create_task_group() as group:
            for _ in range(concurrency):
                group.start_soon(episode)
    wall = time.monotonic() - started
    steps_done = concurrency * steps * waves
    return Row(
        subject="floor:engine",
        concurrency=concurrency,
        episodes=concurrency * waves,
        steps=steps_done,
        steps_per_s=round(steps_done / wall, 1),
        ops_per_s=round(steps_done / wall, 1),
        wall_s=round(wall, 3),
        extra={
            "engine_latency_ms": latency * 1000,
            "ideal_steps_per_s": concurrency / latency,
            "of_ideal": round(steps_done / wall / (concurrency / latency), 3),
            **_ramp(engine.first_asks, started),
            **_pauses(pauses),
        },
    )


@contextlib.contextmanager
def collector_pauses() -> Iterator[list[float]]:
    """The garbage collector's pauses (seconds each) while the block runs: on one event loop
    they stop every episode, and at 1,024 episodes a young collection walks tens of thousands
    of objects in flight (docs/performance.md)."""
    pauses: list[float] = []
    began = 0.0

    def on_collection(phase: str, info: dict[str, int]) -> None:
        nonlocal began
        if phase == "start":
            began = time.perf_counter()
        else:
            pauses.append(time.perf_counter() - began)

    gc.callbacks.append(on_collection)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(on_collection)


def _pauses(pauses: list[float]) -> dict[str, float]:
    return {"gc_pauses": len(pauses), "gc_pause_ms": round(sum(pauses) * 1000, 1)}


def _ramp(first_asks: Sequence[float], started: float) -> dict[str, float]:
    """When the first episode first asked the engine, and when the last one did (ms from the
    start): the engine idles until the first, and the last one's end bounds the run."""
    if not first_asks:
        return {}
    return {
        "first_request_ms": round((first_asks[0] - started) * 1000, 2),
        "all_asked_ms": round((first_asks[-1] - started) * 1000, 2),
    }


class Records(msgspec.Struct, kw_only=True):
    """What one process's engine recorded over a level, and its CPU: a worker's report."""

    turnarounds: list[float]
    periods: list[float]
    first_asks: list[float]  # time.monotonic()
    cpu_s: float
    gc_pauses: list[float]
    leaked: int = 0  # sandboxes its adapter still owned once its episodes were done


def _policy(path: str, engine: FixedLatencyEngine, tokenizer: ByteTokenizer) -> Any:
    if path == "tokens":
        return TokenPolicy(engine, tokenizer, bench_messages, sampling=Sampling(max_tokens=64))
    return MessagePolicy(engine)


def workload(
    path: str, episodes: int, steps: int, latency: float, adapter: str, adapter_options: dict[str, Any]
) -> Workload:
    """A ``--processes`` worker's share of a level (``ProcessRollout``'s build): its own fake
    engine, the path's policy and the adapter; its report is the engine's ``Records``."""
    tokenizer = ByteTokenizer()
    engine = FixedLatencyEngine(latency, tokenizer)
    pauses = contextlib.ExitStack().enter_context(collector_pauses())  # for the worker's lifetime
    backend = get_adapter(adapter, **adapter_options)

    async def report() -> dict[str, Any]:
        cpu = time.process_time() - engine.cpu_at_first_ask
        return msgspec.to_builtins(engine.records(cpu, pauses, len(await backend.list_owned())))

    tasks: list[Any] = steps_tasks(episodes, steps=steps)  # StepsTask: a Task by shape (max_steps a property)
    return Workload(tasks, _policy(path, engine, tokenizer), backend, report=report)


async def _count(trajectories: AsyncIterable[Trajectory], path: str) -> tuple[int, int]:
    """(episodes, steps) of a level's rollout, each episode checked as it comes."""
    done = steps_done = 0
    async for trajectory in trajectories:
        if trajectory.status != "finished":
            raise RuntimeError(f"turnaround: an episode failed ({trajectory.end_reason}): {trajectory.error}")
        if path == "tokens" and any(step.action.tokens is None for step in trajectory.steps):
            raise RuntimeError("turnaround: a token episode has a step without its tokens")
        done += 1
        steps_done += len(trajectory.steps)
    return done, steps_done


async def _level(
    path: str,
    concurrency: int,
    steps: int,
    latency: float,
    adapter_name: str,
    adapter_options: dict[str, Any],
    waves: int = 1,
) -> tuple[Row, int]:
    tokenizer = ByteTokenizer()
    engine = FixedLatencyEngine(latency, tokenizer)
    policy = _policy(path, engine, tokenizer)
    tasks: list[Any] = steps_tasks(concurrency * waves, steps=steps)
    async with get_adapter(adapter_name, **adapter_options) as adapter:
        started, cpu_started = time.monotonic(), time.process_time()
        with collector_pauses() as pauses:
            done, steps_done = await _count(rollout(tasks, policy, adapter, concurrency=concurrency, warm=0), path)
        wall = time.monotonic() - started
        cpu = time.process_time() - cpu_started
        leaked = len(await adapter.list_owned())
    return _row(path, concurrency, latency, done, steps_done, wall, started, [engine.records(cpu, pauses)]), leaked


async def _level_in_processes(
    path: str,
    concurrency: int,
    steps: int,
    latency: float,
    adapter_name: str,
    adapter_options: dict[str, Any],
    waves: int,
    processes: int,
) -> tuple[Row, int]:
    """``_level`` as ``processes`` worker processes (``ProcessRollout``), each with its share
    of the episodes and its own engine; the run's time is from when they all started."""
    options = {
        "path": path,
        "episodes": concurrency * waves,
        "steps": steps,
        "latency": latency,
        "adapter": adapter_name,
        "adapter_options": adapter_options,
    }
    run = ProcessRollout(
        "orchard_async.bench.turnaround:workload", options, processes=processes, concurrency=concurrency, warm=0
    )
    cpu_started = time.process_time()
    done, steps_done = await _count(run, path)
    ended = time.monotonic()
    assert run.started is not None
    records = [msgspec.convert(report, Records) for report in run.reports]
    parent = Records(turnarounds=[], periods=[], first_asks=[], cpu_s=time.process_time() - cpu_started, gc_pauses=[])
    row = _row(path, concurrency, latency, done, steps_done, ended - run.started, run.started, [*records, parent])
    row.extra["processes"] = processes
    return row, sum(r.leaked for r in records)


def _row(
    path: str,
    concurrency: int,
    latency: float,
    done: int,
    steps_done: int,
    wall: float,
    started: float,
    records: list[Records],
) -> Row:
    ideal = concurrency / latency
    steps_per_s = steps_done / wall
    turnarounds = [t for r in records for t in r.turnarounds]
    periods = [t for r in records for t in r.periods]
    first_asks = sorted(t for r in records for t in r.first_asks)
    percentiles = ms_percentiles(turnarounds)
    steady = steady_share(latency, periods)
    return Row(
        subject=path,
        concurrency=concurrency,
        ops=len(turnarounds),
        episodes=done,
        steps=steps_done,
        steps_per_s=round(steps_per_s, 1),
        ops_per_s=round(steps_per_s, 1),  # what comparisons set side by side: steps/s
        episodes_per_s=round(done / wall, 2),
        wall_s=round(wall, 3),
        p50_ms=percentiles["p50_ms"],
        p90_ms=percentiles["p90_ms"],
        p95_ms=percentiles["p95_ms"],
        p99_ms=percentiles["p99_ms"],
        extra={
            "engine_latency_ms": latency * 1000,
            "ideal_steps_per_s": ideal,
            "of_ideal": round(steps_per_s / ideal, 3),
            # the same for an episode once it runs: without the ramp (each episode's start, one
            # after another on one loop) and the tail (each one's scoring and close)
            "steady_of_ideal": None if steady is None else round(steady, 3),
            # the CPU per step of this process and its workers (the environment, the rollout and
            # the fake engine): what the ideal rate needs of the cores is ideal_steps_per_s *
            # cpu_us_per_step / 1e6, whatever the load
            "cpu_us_per_step": round(sum(r.cpu_s for r in records) / max(1, steps_done) * 1e6, 1),
            **_ramp(first_asks, started),
            **_pauses([p for r in records for p in r.gc_pauses]),
        },
    )


async def run_turnaround(
    adapter_name: str,
    *,
    concurrency: list[int],
    steps: int = 10,
    latency: float = 0.1,
    waves: int = 4,
    processes: int = 1,
    adapter_options: dict[str, Any] | None = None,
) -> Outcome:
    """Each level's floor and both paths, one wave each, then (``waves`` > 1) each again
    sustained over ``waves`` x ``concurrency`` episodes, its share of the ideal added to the
    one-wave row as ``sustained_of_ideal``. With ``processes`` > 1 the paths run as a
    ``ProcessRollout`` of that many workers (at most one per episode); the floor stays one
    loop's, so a row run in workers has no ``of_floor``."""
    outcome = Outcome(leaked=0)
    options = adapter_options or {}

    async def measure(path: str, level: int, waves: int = 1) -> tuple[Row, int]:
        workers = min(processes, level)
        if workers > 1:
            return await _level_in_processes(path, level, steps, latency, adapter_name, options, waves, workers)
        return await _level(path, level, steps, latency, adapter_name, options, waves)

    for level in concurrency:
        floor = await _engine_floor(level, steps, latency)
        outcome.rows.append(floor)
        for path in ("messages", "tokens"):  # the same level, one after the other, in one run
            row, leaked = await measure(path, level)
            if "processes" not in row.extra:
                row.extra["of_floor"] = round((row.steps_per_s or 0) / (floor.steps_per_s or 1), 3)
            outcome.rows.append(row)
            outcome.leaked = (outcome.leaked or 0) + leaked
        if waves > 1:
            sustained = [await _engine_floor(level, steps, latency, waves)]
            for path in ("messages", "tokens"):
                row, leaked = await measure(path, level, waves)
                sustained.append(row)
                outcome.leaked = (outcome.leaked or 0) + leaked
            for one_wave, run in zip(outcome.rows[-3:], sustained, strict=True):
                one_wave.extra["sustained_episodes"] = run.episodes
                one_wave.extra["sustained_of_ideal"] = run.extra["of_ideal"]
    outcome.comparisons = compare_rows(outcome.rows, "tokens", "messages")
    outcome.notes.append(
        "turnaround: the engine's reply to the same episode's next request (p50/p99 ms); of_ideal: steps/s "
        "over concurrency / engine latency, one wave of episodes that start at once; sustained_of_ideal: the same "
        "over sustained_episodes with `concurrency` in flight throughout (steady_of_ideal: the engine's latency "
        "over the mean time between an episode's consecutive requests); floor:engine: the same engine, "
        "episodes and steps with no environment (of_floor: a path's steps/s over the floor's); "
        "first_request_ms / all_asked_ms: when the first and the last episode first asked the engine; "
        "gc_pauses / gc_pause_ms: the collector's pauses during the level; "
        "cpu_us_per_step: this process's CPU per step (load-independent); "
        "comparisons: tokens against messages (ops ratio < 1: tokens slower)"
    )
    return outcome
