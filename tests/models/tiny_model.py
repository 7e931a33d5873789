"""A tiny randomly initialised causal LM and a tokenizer trained offline, saved to a folder:
a real model (Qwen2's architecture, two layers, hidden size 32) for the token path's tests,
built in well under a second with nothing downloaded.

``build_tiny_model(folder)`` writes the model and its tokenizer (byte-level BPE trained with
``tokenizers`` on the recipes' own prompts, with a ChatML chat template); the ``tiny_model``
fixture (tests/models/conftest.py) builds one per test session. Needs the ``tokens`` extra."""

from __future__ import annotations

from pathlib import Path

EXTRA = "pip install -e '.[tokens]'"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def corpus() -> list[str]:
    """Text like what the recipes send: their prompts, shell commands and outputs."""
    from orchard_async.recipes import toy
    from orchard_async.recipes.swe import agent

    lines = [toy.SYSTEM_PROMPT, agent.SYSTEM_PROMPT, agent.INSTANCE_TEMPLATE, agent.FORMAT_ERROR_TEMPLATE]
    lines += [task.instruction for task in toy.builtin_tasks(2)]
    lines += [command for task in toy.builtin_tasks(2) for command in task.solution]
    lines += ["```bash\nls -la\n```", "THOUGHT: I look around.", "<returncode>0</returncode>\n<output>\n</output>"]
    return lines * 4


def build_tiny_model(folder: Path, *, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE
    )
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16384,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.save_pretrained(folder)
    return folder
