"""The token policy calls a transformers fast tokenizer's Rust tokenizer directly (its
wrapper costs 40-70 us a call): only when that gives what the tokenizer's own calls give,
checked against them on the first calls and now and then, and never around a class that
changes the call or a Rust tokenizer set to truncate. Needs the ``tokens`` extra."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchard_async.models.tokens import rust as rust_module
from orchard_async.models.tokens.local import load_tokenizer
from orchard_async.models.tokens.policy import TokenPolicy, bash_reply
from orchard_async.models.tokens.rust import RustTokenizer
from tests.models.token_support import FakeTokenEngine

# The tiny model's tokenizer, trained once per worker (about 18 s): the only default-run user
# of it, so these run with the parity tests, which build it anyway.
pytestmark = pytest.mark.soak

TEXTS = [
    "<|im_end|>\n<|im_start|>user\n(exit status 0)<|im_end|>\n<|im_start|>assistant\n",
    "THOUGHT: I look around.\n\n```bash\nls -la\n```",
    "caf\u00e9 \u2014 \u00fcber \U0001f600 tabs\tand  spaces  ",
    "",
]


def policy_of(tokenizer: Any) -> TokenPolicy:
    return TokenPolicy(FakeTokenEngine(tokenizer, lambda prompt, turn: "```bash\nls\n```"), tokenizer, list)


def test_the_rust_tokenizer_gives_the_tokenizers_own_ids_and_text(tiny_model: Path) -> None:
    tokenizer = load_tokenizer(tiny_model)
    policy = policy_of(tokenizer)
    assert policy._rust is not None  # the tests' tokenizer is one it may call around
    for _ in range(rust_module.RUST_CHECKS + 2):  # past the checked calls: the Rust tokenizer alone
        for text in TEXTS:
            ids = policy.encode(text)
            assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]
            assert policy.decode(ids) == tokenizer.decode(ids, skip_special_tokens=True)
    assert policy._rust.trusted


def test_a_rust_tokenizer_set_to_truncate_is_not_called_around(tiny_model: Path) -> None:
    tokenizer = load_tokenizer(tiny_model)
    policy = policy_of(tokenizer)
    for text in TEXTS:  # past the checked calls
        policy.encode(text)
    for _ in range(rust_module.RUST_CHECKS):
        policy.encode(TEXTS[0])
    tokenizer.backend_tokenizer.enable_truncation(max_length=3)
    assert not policy._rust.usable()
    assert len(policy.encode(TEXTS[1])) > 3  # the tokenizer's own call: it truncates only when asked


def test_a_disagreement_hands_every_call_back_to_the_tokenizer(tiny_model: Path) -> None:
    tokenizer = load_tokenizer(tiny_model)
    policy = policy_of(tokenizer)
    rust = policy._rust
    assert rust is not None

    class Off:
        """A Rust tokenizer that encodes one id short."""

        truncation = padding = None
        encode_special_tokens = False

        def encode(self, text: str, add_special_tokens: bool) -> Any:
            real = tokenizer.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens)
            return type("Encoding", (), {"ids": real.ids[:-1]})

        def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
            return tokenizer.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    rust.backend = Off()
    assert policy.encode(TEXTS[1]) == tokenizer(TEXTS[1], add_special_tokens=False)["input_ids"]
    assert not rust.trusted and not rust.usable()


def test_a_class_that_changes_the_call_is_called_as_it_is(tiny_model: Path) -> None:
    tokenizer = load_tokenizer(tiny_model)

    class Prefixed(type(tokenizer)):  # type: ignore[misc]
        def __call__(self, text: str, **options: Any) -> Any:
            return super().__call__(" " + text, **options)

    tokenizer.__class__ = Prefixed
    policy = TokenPolicy(FakeTokenEngine(tokenizer, lambda p, t: ""), tokenizer, list, parse_reply=bash_reply)
    assert policy._rust is None
    assert policy.encode("ls") == tokenizer("ls", add_special_tokens=False)["input_ids"]
    assert RustTokenizer.under(object()) is None
