"""A character-level Hugging Face tokenizer built offline: for the toy world and for tests.

Ids: 0 `<pad>`, 1 `<s>` (BOS, added in front of every encoding), 2 `</s>` (EOS), 3 `<unk>`, then one id per
character of `alphabet` in order. It saves and loads like any `PreTrainedTokenizerFast`.
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
PRINTABLE = string.digits + string.ascii_letters + string.punctuation + " \n"


def make_char_tokenizer(alphabet: str = PRINTABLE):
    """`PreTrainedTokenizerFast` with one token per character of `alphabet` (duplicates are an error)."""
    from transformers import PreTrainedTokenizerFast  # heavy (1 s): only when one is made

    if len(set(alphabet)) != len(alphabet):
        raise ValueError("make_char_tokenizer: alphabet has repeated characters")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({ch: len(SPECIAL_TOKENS) + i for i, ch in enumerate(alphabet)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
