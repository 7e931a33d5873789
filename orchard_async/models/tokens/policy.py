"""A token-in/token-out policy for every recipe: ``--policy tokens --engine KIND:WHERE``.

The policy samples through a ``TokenEngine`` and keeps, per turn, what a trainer needs
(``TurnTokens`` on the step's action: the tokens the environment added, the sampled ids, the
sampler's logprobs, the weight version). The prompt of turn t+1 is exactly the context of
turn t plus its sampled tokens plus the observation's tokens; nothing that came before is
ever re-tokenized.

Where the conversation comes from: the recipe's own chat builder (``Chats.messages_of`` of its
``token_chats`` when it has one, a text model's form of its chat (the GUI's: no screenshots),
else of its ``training_chats``, the one the exports use), so the model sees each recipe's
system prompt, task and observations as that recipe writes them; its replies are parsed into
actions by the recipe's ``parse_reply`` (a module attribute; by default the bash-block
protocol of the toy and SWE recipes: exactly one ```bash block, ``submit`` to finish). A
recipe's ``automatic_action(observation)`` (a module attribute) is a turn its policies take
without asking the model (the GUI's ``submit`` after an answer): no tokens, no engine call.

The observation's tokens are the chat template's delta: the text the template adds after an
assistant turn (with a stand-in content) when the recipe's new messages follow it, checked
to be a true extension of the template's text; the template's end-of-turn tokens the sampler
did not produce itself (a reply cut at the token limit, the newline after ``<|im_end|>``) go
in front. A turn where that does not hold (the recipe rewrote earlier messages, a template
that renders a prefix differently, a step this policy did not sample) starts a new segment,
whose prompt is the whole conversation rendered afresh, and is recorded as such.

The policy keeps no state between turns that it needs: the context is rebuilt from the
episode's own steps (their ``TurnTokens``), so a retried, resumed or forked episode continues
correctly. What it keeps is only to save work, and is used only when it still holds:

* the recipe's conversation at each episode's last turn (``before`` of the next turn), used
  when the next turn's history is that turn's plus one step, the very same ``Step`` objects
  (a resumed, retried or forked episode's are not: its conversation is built again);
* each episode's last prompt, as a compact ``array('i')`` (no object per token, nothing for
  the garbage collector to walk), used when the next turn's last step holds the very
  ``TurnTokens`` that prompt was made for: the next prompt is it plus that turn's sampled
  tokens plus the observation's, instead of the segment's turns concatenated again. The
  engine is given that array (a ``Sequence[int]``; the engines copy it into their request)
  and it is never changed afterwards: each turn's prompt is a new array;
* the template's delta rendered after a short fixed conversation (``BASE``) instead of the
  whole history: each turn renders only the observation's messages, not the episode. That
  holds when the template's text after an assistant turn depends on the new messages alone;
  it is checked against the whole history on the first ``DELTA_CHECKS`` observations of
  each kind (the roles of its messages), each at its own history length, and on every
  ``DELTA_CHECK_EVERY``-th after; a kind for which it does not hold is from then on rendered
  with the whole history on every turn, as before. (A template whose delta changed only at
  a history length never checked would go unnoticed; no chat template we know does that.)
"""

from __future__ import annotations

import re
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchard_async.errors import ConfigError, ContextExhausted
from orchard_async.models.client import ModelConfig
from orchard_async.models.tokens import Sampling, TokenEngine, make_engine
from orchard_async.models.tokens.rust import RustTokenizer
from orchard_async.records.trajectory import Action, Step, Trajectory, TurnTokens, episode_so_far
from orchard_async.task import Observation

Message = dict[str, Any]
MessagesOf = Callable[[Trajectory], list[Message]]
ParseReply = Callable[[str], Action]
AutomaticAction = Callable[[Observation], Action | None]

# The assistant content the template is rendered with to find its delta: any text the
# template keeps as it is.
STAND_IN = "ORCHARD-REPLY-STAND-IN"
# The short conversation an observation's delta is rendered after (see the module's docstring).
BASE: list[Message] = [{"role": "user", "content": "ORCHARD-BASE"}, {"role": "assistant", "content": STAND_IN}]
# Episodes whose last conversation is kept (a dict entry each: the recipe's messages);
# beyond that the oldest are dropped and built again if they come back.
KEPT_CONVERSATIONS = 8192
# Token ids of the episodes' last prompts kept (see the module's docstring; 4 bytes an id):
# beyond that the least recently used are dropped and built again from the steps if needed.
KEPT_PROMPT_IDS = 32 * 1024 * 1024
# Observations of a kind whose short render is checked against the whole history: the first
# DELTA_CHECKS, then every DELTA_CHECK_EVERY-th.
DELTA_CHECKS = 3
DELTA_CHECK_EVERY = 64
_BLOCK = re.compile(r"```(?:bash|sh)[ \t]*\r?\n(.*?)```", re.DOTALL)


def bash_reply(text: str) -> Action:
    """The toy and SWE recipes' reply protocol: exactly one ```bash block; ``submit`` ends."""
    blocks = _BLOCK.findall(text)
    if len(blocks) != 1:
        return Action(kind="invalid", raw=text, error=f"expected exactly one ```bash block, found {len(blocks)}")
    command = blocks[0].strip()
    if not command:
        return Action(kind="invalid", raw=text, error="the ```bash block is empty")
    if command == "submit":
        return Action(kind="submit", command=command, raw=text)
    return Action(command=command, raw=text)


def _extend(ids: array[int], more: Sequence[int]) -> None:
    if type(more) is list:
        ids.fromlist(more)  # twice as fast as extend, which takes any iterable
    else:
        ids.extend(more)


def _partial(observation: Observation, steps: Sequence[Step]) -> Trajectory:
    """The episode so far, as the recipe's chat builder reads a trajectory."""
    task_id = getattr(observation.task, "id", "")
    return episode_so_far(observation.episode_id, observation.instruction, steps, task_id=task_id, policy="tokens")


class TokenPolicy:
    """Samples each turn through ``engine`` from the recipe's conversation, token in, token out."""

    def __init__(
        self,
        engine: TokenEngine,
        tokenizer: Any,
        messages_of: MessagesOf,
        *,
        parse_reply: ParseReply = bash_reply,
        automatic_action: AutomaticAction | None = None,
        sampling: Sampling | None = None,
        token_budget: int = 0,
    ):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ConfigError("the tokenizer has no chat template: the token policy renders the recipe's chat with it")
        self.engine = engine
        self.tokenizer = tokenizer
        self.messages_of = messages_of
        self.parse_reply = parse_reply
        self.automatic_action = automatic_action
        self.sampling = sampling or Sampling()
        self.token_budget = token_budget
        self.name = f"tokens:{engine.name}"
        # episode -> (the steps its conversation was built from, their last Step, the conversation)
        self._conversations: OrderedDict[str, tuple[int, Step | None, list[Message]]] = OrderedDict()
        # episode -> (its last turn's record, the prompt sampled from at that turn); ids summed in _prompt_ids
        self._prompts: OrderedDict[str, tuple[TurnTokens, array[int]]] = OrderedDict()
        self._prompt_ids = 0
        # the roles of an observation's messages -> whether BASE gives the whole history's delta
        # (False for good once a check finds it does not), and how many of them came
        self._local_delta: dict[tuple[str, ...], bool] = {}
        self._delta_seen: dict[tuple[str, ...], int] = {}
        self._base: tuple[str, list[int]] | None = None  # (BASE's text, its end of turn); None: unusable
        self._base_rendered = False
        self._rust = RustTokenizer.under(tokenizer)

    # -- rendering ---------------------------------------------------------------------------

    def render(self, messages: list[Message], *, generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        return str(text)

    def encode(self, text: str) -> list[int]:
        rust = self._rust
        if rust is not None and rust.usable():
            return rust.encode(text)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        rust = self._rust
        if rust is not None and rust.usable():
            return rust.decode(ids)
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def observation_ids(self, before: list[Message], added: list[Message], sampled: list[int]) -> list[int] | None:
        """The tokens that follow a reply sampled after ``before`` when the recipe adds
        ``added`` (its observation messages), or None when the template's text is not an
        extension (the turn then starts a new segment)."""
        kind = tuple([str(message.get("role")) for message in added])  # a list first: faster than a generator
        local = self._local_delta.get(kind, True)
        seen = self._delta_seen[kind] = self._delta_seen.get(kind, 0) + 1
        if local and (seen <= DELTA_CHECKS or seen % DELTA_CHECK_EVERY == 0):
            # the short render must give the whole one's delta (a template that counts its history
            # can agree on one length by chance: checked on a few lengths, then now and then)
            delta = self._whole_delta(before, added)
            self._local_delta[kind] = delta is not None and self._base_delta(added) == delta
        else:
            delta = self._base_delta(added) if local else self._whole_delta(before, added)
        if delta is None:
            return None
        end_of_turn, text = delta
        # what of the template's end of turn the sampler produced itself (its end token)
        produced = 0
        for k in range(min(len(end_of_turn), len(sampled)), 0, -1):  # a longer k cannot match
            if sampled[-k:] == end_of_turn[:k]:
                produced = k
                break
        ids = self.encode(text)
        return end_of_turn[produced:] + ids if produced < len(end_of_turn) else ids

    def _whole_delta(self, before: list[Message], added: list[Message]) -> tuple[list[int], str] | None:
        """(the template's end of an assistant turn, the text it adds for ``added``), rendered
        after the whole of ``before``; None when that is not an extension."""
        turn = [*before, {"role": "assistant", "content": STAND_IN}]
        closed = self.render(turn, generation_prompt=False)
        extended = self.render([*turn, *added], generation_prompt=True)
        if not extended.startswith(closed) or STAND_IN not in closed:
            return None
        return self.encode(closed[closed.rindex(STAND_IN) + len(STAND_IN) :]), extended[len(closed) :]

    def _base_delta(self, added: list[Message]) -> tuple[list[int], str] | None:
        """The same, rendered after ``BASE`` (a few messages) instead of the episode."""
        if not self._base_rendered:
            self._base_rendered = True
            try:
                closed = self.render(BASE, generation_prompt=False)
            except Exception:  # a template that refuses so short a chat: the whole history every turn
                closed = ""
            where = closed.rfind(STAND_IN)
            self._base = (closed, self.encode(closed[where + len(STAND_IN) :])) if where >= 0 else None
        if self._base is None:
            return None
        closed, end_of_turn = self._base
        try:
            extended = self.render([*BASE, *added], generation_prompt=True)
        except Exception:
            return None
        if not extended.startswith(closed):
            return None
        return end_of_turn, extended[len(closed) :]

    def _conversation(self, observation: Observation, steps: int) -> list[Message]:
        """The recipe's conversation over the first ``steps`` steps of the episode: kept from
        the episode's last turn when these are still the steps it was built from."""
        history = observation.history
        kept = self._conversations.get(observation.episode_id)
        if kept is not None and kept[0] == steps and kept[1] is (history[steps - 1] if steps else None):
            return kept[2]
        return self.messages_of(_partial(observation, history[:steps]))

    def _keep(self, observation: Observation, messages: list[Message]) -> None:
        history = observation.history
        self._conversations[observation.episode_id] = (len(history), history[-1] if history else None, messages)
        self._conversations.move_to_end(observation.episode_id)
        if len(self._conversations) > KEPT_CONVERSATIONS:
            self._conversations.popitem(last=False)

    def next_prompt(self, observation: Observation) -> tuple[TurnTokens, array[int]]:
        """This turn's record (its segment and the tokens added before it) and the whole
        prompt to sample from."""
        history = observation.history
        now = self.messages_of(_partial(observation, history))
        before = self._conversation(observation, len(history) - 1) if history else []
        self._keep(observation, now)
        last = history[-1].action.tokens if history else None
        context = self._segment_so_far(observation.episode_id, history, last)
        if context is not None:
            assert last is not None
            added = self._added(before, now, history[-1])
            if added is not None:
                delta = self.observation_ids(before, added, last.token_ids)
                if delta is not None:
                    context.fromlist(delta)  # a new array, built for this turn
                    return self._keep_prompt(observation, TurnTokens(segment=last.segment, prompt_ids=delta), context)
            segment_index = last.segment + 1
        else:
            turns = (step.action.tokens for step in history)
            segment_index = max((turn.segment + 1 for turn in turns if turn is not None), default=0)
        prompt = self.encode(self.render(now, generation_prompt=True))
        # a turn after a step without tokens is kept too, but never continued: the next turn
        # starts a new segment again while that step is in the history (see _segment_so_far)
        reusable = context is not None or not history
        record = TurnTokens(segment=segment_index, prompt_ids=prompt)
        context = array("i")
        context.fromlist(prompt)
        return self._keep_prompt(observation, record, context, reusable=reusable)

    def _segment_so_far(self, episode_id: str, history: Sequence[Step], last: TurnTokens | None) -> array[int] | None:
        """The last turn's segment as a new array (its prompts and sampled tokens, up to the
        tokens this turn adds), or None when this turn cannot continue it: no history, or a
        step without tokens (a step this policy did not sample) anywhere in it."""
        if last is None:
            return None
        kept = self._prompts.get(episode_id)
        if kept is not None and kept[0] is last:  # the prompt ``last`` was sampled from: every turn had tokens
            context = kept[1][:]  # a copy (one memcpy): the kept prompt went to the engine as it is
            _extend(context, last.token_ids)
            return context
        turns = [step.action.tokens for step in history]
        if any(turn is None for turn in turns):
            return None
        context = array("i")
        for turn in turns:
            if turn is not None and turn.segment == last.segment:
                _extend(context, turn.prompt_ids)
                _extend(context, turn.token_ids)
        return context

    def _keep_prompt(
        self, observation: Observation, record: TurnTokens, prompt: array[int], *, reusable: bool = True
    ) -> tuple[TurnTokens, array[int]]:
        episode_id = observation.episode_id
        old = self._prompts.pop(episode_id, None)
        if old is not None:
            self._prompt_ids -= len(old[1])
        if not reusable:
            return record, prompt
        self._prompts[episode_id] = (record, prompt)
        self._prompt_ids += len(prompt)
        while (self._prompt_ids > KEPT_PROMPT_IDS or len(self._prompts) > KEPT_CONVERSATIONS) and len(
            self._prompts
        ) > 1:
            _, (_, dropped) = self._prompts.popitem(last=False)
            self._prompt_ids -= len(dropped)
        return record, prompt

    def episode_ended(self, episode_id: str) -> None:
        """The episode ended (protocols.Policy; the engine calls it however it ended): what
        was kept to save its next turn's work is not needed again."""
        self._conversations.pop(episode_id, None)
        kept = self._prompts.pop(episode_id, None)
        if kept is not None:
            self._prompt_ids -= len(kept[1])

    @staticmethod
    def _added(before: list[Message], now: list[Message], step: Step) -> list[Message] | None:
        """The recipe's messages after the last reply (its observation), or None when its
        conversation is not ``before`` plus that reply plus them. A step the recipe's chat
        leaves out (the toy chat skips unreadable replies) is answered with the step's own
        observation, the episode's word for what went wrong."""
        if now[: len(before)] != before:
            return None
        new = now[len(before) :]
        if not new:
            return [{"role": "user", "content": step.observation or f"error: {step.action.error}"}]
        if new[0].get("role") != "assistant" or any(message.get("role") == "assistant" for message in new[1:]):
            return None
        return new[1:]

    # -- acting --------------------------------------------------------------------------------

    async def act(self, observation: Observation) -> Action:
        if self.automatic_action is not None:
            own = self.automatic_action(observation)
            if own is not None:
                return own
        if self.token_budget:
            spent = sum(step.action.usage.get("total_tokens", 0) for step in observation.history)
            if spent >= self.token_budget:
                return Action(kind="submit", error=f"token budget spent ({spent} of {self.token_budget} tokens)")
        record, prompt = self.next_prompt(observation)
        generation = await self.engine.generate(prompt, self.sampling)
        text = self.decode(generation.token_ids)
        action = self.parse_reply(text)
        if action.kind == "submit":
            self.episode_ended(observation.episode_id)
        action.raw = text
        record.token_ids = generation.token_ids
        record.logprobs = generation.logprobs
        record.finish_reason = generation.finish_reason
        record.weight_version = generation.weight_version
        action.tokens = record
        completion = len(generation.token_ids)
        if not completion:
            raise ContextExhausted(f"the engine sampled nothing after {len(prompt)} prompt tokens: the context is full")
        action.usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": completion,
            "total_tokens": len(prompt) + completion,
        }
        return action

    async def close(self) -> None:
        await self.engine.close()


def token_policy(
    recipe: str,
    engine: str | TokenEngine,
    *,
    tokenizer: str | Any | None = None,
    options: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> TokenPolicy:
    """The token policy for ``recipe`` (by name): its chat builder and reply parser, the
    ``engine`` (``KIND:WHERE`` or an engine), and the tokenizer (a folder, or a loaded one;
    by default the transformers engine's model folder). Sampling is the model client's
    (``ORCHARD_TEMPERATURE``, ``ORCHARD_MAX_TOKENS``, ``ORCHARD_TOKEN_BUDGET``)."""
    from orchard_async.models.tokens.local import load_tokenizer
    from orchard_async.runtime import load_recipe  # the registry: only when a policy is made

    module = load_recipe(recipe)
    chats_of = getattr(module, "token_chats", None) or getattr(module, "training_chats", None)
    if not callable(chats_of):
        raise ConfigError(f"the {recipe} recipe has no chat builder (training_chats): it cannot run token policies")
    chats = chats_of(dict(options or {}))
    parse = getattr(module, "parse_reply", None)
    made = make_engine(engine, environ) if isinstance(engine, str) else engine
    if tokenizer is None:
        folder = getattr(made, "path", None)
        if folder is None:
            raise ConfigError(f"--engine {made.name} needs --tokenizer PATH (the served model's tokenizer folder)")
        tokenizer = folder
    loaded = load_tokenizer(tokenizer) if isinstance(tokenizer, str) or hasattr(tokenizer, "is_dir") else tokenizer
    config = ModelConfig.from_env(environ, model="tokens")
    sampling = Sampling(max_tokens=config.max_tokens, temperature=config.temperature)
    return TokenPolicy(
        made,
        loaded,
        chats.messages_of,
        parse_reply=parse if callable(parse) else bash_reply,
        automatic_action=getattr(module, "automatic_action", None),
        sampling=sampling,
        token_budget=config.token_budget,
    )
