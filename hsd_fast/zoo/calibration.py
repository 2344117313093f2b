"""The zoo's calibration windows: held-out token windows per corpus source, committed as
``zoo/calibration.safetensors``, on which acceptance and the selector are measured (``hsd-fast
select``, ``hsd-fast zoo accept``, the demo, the bench's zoo scenario).

Reading them is runtime: it needs neither the corpus nor the trainer. ``hsd_fast.zoo.build`` writes
them (``write_calibration``) by a fixed rule from the corpus's validation tokens. A model on another
tokenizer (a checkpoint of the user's) reads the same text in its own ids (``calibration_in``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

CALIBRATION = "calibration.safetensors"


def read_calibration(zoo_dir: Path) -> dict[str, torch.Tensor]:
    """Held-out windows per source: [windows, length] int64 token ids."""
    from safetensors.torch import load_file

    return {k: v.long() for k, v in load_file(str(zoo_dir / CALIBRATION)).items()}


def calibration_in(zoo_dir: Path, tokenizer) -> dict[str, torch.Tensor]:
    """The held-out windows per source in ``tokenizer``'s ids: as committed where ``tokenizer`` has
    the zoo's shared vocabulary; else each window's text (decoded by the shared tokenizer) encoded by
    ``tokenizer`` without special tokens (a window is text from the middle of a document), every
    window of a source cut to the fewest ids any of them got. Ids of another vocabulary would be
    another text, or no text at all (ids past the model's embedding)."""
    import torch

    from hsd_fast import zoo
    from hsd_fast.other_tokenizer import same_tokenizer

    windows = read_calibration(zoo_dir)
    shared = zoo.load_tokenizer()
    if same_tokenizer(tokenizer, shared):
        return windows
    encoded = {}
    for source, rows in windows.items():
        texts = shared.batch_decode(rows.tolist(), skip_special_tokens=True)
        ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
        width = min(len(row) for row in ids)
        encoded[source] = torch.tensor([row[:width] for row in ids], dtype=torch.long)
    return encoded
