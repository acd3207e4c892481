"""A chat tokenizer and a random chat Llama built here, no pytest needed: tests/rollout's chat, endpoint and multi-turn
tests import them, and so does bench/verifiers_endpoint.py (whose side venv has no pytest)."""

from __future__ import annotations

import torch

# ChatML's shape with spaces for newlines (the character vocabulary has no newline)
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")


def chat_tokenizer(template: str = TEMPLATE):
    """The built-in character tokenizer with ChatML's two turn tokens and `template`."""
    from transformers import AutoTokenizer

    from scalerl.models.paths import builtin_model_dir

    tok = AutoTokenizer.from_pretrained(builtin_model_dir())
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = template
    return tok


def chat_llama(tok, seed: int = 0):
    """A random-init Llama of `tok`'s vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=128, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=tok.bos_token_id)
    return LlamaForCausalLM(config)
