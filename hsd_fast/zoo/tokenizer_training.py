"""Training the zoo's tokenizer: byte-level BPE (``tokenizers``) over the corpus's training documents,
wrapped as an HF fast tokenizer whose one special token, ``EOS``, is BOS, EOS and padding.

Build side only: ``hsd-fast zoo build`` reuses the committed tokenizer and retrains it only when asked
(``--retrain-tokenizer``), because every model of the zoo is tied to its ids.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from hsd_fast.zoo.tokenizer import EOS


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8192) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=True,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return as_hf(tokenizer)


def as_hf(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=EOS, eos_token=EOS, pad_token=EOS, unk_token=None
    )
