"""The character-level tokenizer of the built-in model, made with `tokenizers`.

One token per character, `<s>` prepended to every encoded text, `</s>` ends an answer. Ids 0-19
are laid out exactly as in the CPU reference benchmark (`shared/bench/tiny_task.py`) so the two
vocabularies agree where they overlap; the rest adds the characters that other built-in tasks
(subtraction, products, tool tags) need.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]
CHARS = list("0123456789") + ["+", "=", " "] + list("QAT") + list("-*()/.,:?") + list("abcdefghijklmnopqrstuvwxyz")
VOCAB = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}


def build_char_tokenizer(model_max_length: int = 64) -> PreTrainedTokenizerFast:
    """A left-padding character tokenizer that prepends BOS, ready for `save_pretrained`."""
    tok = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()  # characters are concatenated back without separators
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, VOCAB[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",  # decoder-only generation wants prompts aligned on the right
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )
