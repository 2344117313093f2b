"""The zoo's tokenizer: byte-level BPE (``tokenizers``), saved as an HF fast tokenizer.

It is trained once and committed under ``zoo/tokenizer``; ``hsd-fast zoo build`` reuses the committed
one and retrains only when asked to (``--retrain-tokenizer``), because every model of the zoo is
tied to its ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS = "<|endoftext|>"  # id 0: document separator, BOS, EOS and padding


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


def load_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer under {path} (expected tokenizer.json)")
    return PreTrainedTokenizerFast.from_pretrained(str(path))
