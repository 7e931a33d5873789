"""Calling the Rust tokenizer under a transformers fast tokenizer directly, where its Python
wrapper adds nothing but time (see ``RustTokenizer``): the token policy's encode of each
observation and decode of each reply."""

from __future__ import annotations

from typing import Any

# transformers' own classes of a tokenizer over a Rust ``tokenizers.Tokenizer`` (5.x, 4.x)
_FAST_BASES = ("transformers.tokenization_utils_tokenizers", "transformers.tokenization_utils_fast")
# what a call of the tokenizer or its decode goes through: a class that changes any of them
# is called as it is, never around
_CALL_PATH = (
    "__call__", "_call_one", "encode_plus", "_encode_plus", "_batch_encode_plus",
    "decode", "_decode", "_switch_to_input_mode",
)  # fmt: skip
# Calls checked against the tokenizer's own before the Rust tokenizer is trusted alone, then
# one in RUST_CHECK_EVERY.
RUST_CHECKS = 8
RUST_CHECK_EVERY = 64


class RustTokenizer:
    """The ``tokenizers.Tokenizer`` under a transformers fast tokenizer, called directly.

    ``tokenizer(text, add_special_tokens=False)`` and ``tokenizer.decode(ids,
    skip_special_tokens=True)`` are the Rust tokenizer's ``encode``/``decode`` wrapped in 40-70
    us of Python per call (on this machine: 73 against 37 us to encode an observation, 13
    against 5 us to decode a reply), a cost every turn pays. The wrapper adds nothing to
    these two calls when its class changes none of them, it neither splits special tokens nor
    cleans up spaces, and the Rust tokenizer is set to neither truncate nor pad (checked on
    every call: anyone holding the tokenizer may change that); even so the first
    ``RUST_CHECKS`` calls of each, and one in ``RUST_CHECK_EVERY`` after, are made both ways and
    must agree, or the wrapper is called from then on."""

    def __init__(self, tokenizer: Any, backend: Any):
        self.tokenizer = tokenizer
        self.backend = backend
        self.trusted = True
        self._calls = {"encode": 0, "decode": 0}

    @classmethod
    def under(cls, tokenizer: Any) -> RustTokenizer | None:
        """The Rust tokenizer of ``tokenizer``, when it may be called around it; else None."""
        kind = type(tokenizer)
        base = next((c for c in kind.__mro__ if c.__module__ in _FAST_BASES), None)
        backend = getattr(tokenizer, "_tokenizer", None)
        if base is None or type(backend).__module__.split(".")[0] != "tokenizers":
            return None
        if any(getattr(kind, name, None) is not getattr(base, name, None) for name in _CALL_PATH):
            return None
        if getattr(tokenizer, "split_special_tokens", False) or getattr(
            tokenizer, "clean_up_tokenization_spaces", True
        ):
            return None
        return cls(tokenizer, backend)

    def usable(self) -> bool:
        backend = self.backend
        return (
            self.trusted
            and backend.truncation is None
            and backend.padding is None
            and not getattr(backend, "encode_special_tokens", False)
        )

    def _check(self, call: str) -> bool:
        calls = self._calls[call] = self._calls[call] + 1
        return calls <= RUST_CHECKS or calls % RUST_CHECK_EVERY == 0

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self.backend.encode(text, add_special_tokens=False).ids
        if self._check("encode"):
            own = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            if own != ids:
                self.trusted = False
                return own
        return ids

    def decode(self, ids: list[int]) -> str:
        text: str = self.backend.decode(ids, skip_special_tokens=True)
        if self._check("decode"):
            own = str(self.tokenizer.decode(ids, skip_special_tokens=True))
            if own != text:
                self.trusted = False
                return own
        return text
