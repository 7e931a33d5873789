from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import backend_missing
from tests.models.tiny_model import EXTRA, build_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 model with an offline-trained tokenizer, built once per session."""
    for module in ("torch", "transformers", "tokenizers"):
        try:
            __import__(module)
        except ImportError:
            backend_missing(f"the token path's tests need {module}: {EXTRA}")
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
