"""The zoo's tokenizer, loaded: byte-level BPE saved as an HF fast tokenizer under ``zoo/tokenizer``.

Every model of the zoo is tied to its ids, so it is trained once (``tokenizer_training``, by
``hsd-fast zoo build --retrain-tokenizer``) and committed; loading needs only ``transformers``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # transformers is imported only when the tokenizer is loaded
    from transformers import PreTrainedTokenizerFast

EOS = "<|endoftext|>"  # id 0: document separator, BOS, EOS and padding


def load_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer under {path} (expected tokenizer.json)")
    return PreTrainedTokenizerFast.from_pretrained(str(path))
