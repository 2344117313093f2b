"""The zoo's calibration windows: held-out token windows per corpus source, committed as
``zoo/calibration.safetensors``, on which acceptance and the selector are measured (``hsd-fast
select``, ``hsd-fast zoo accept``, the demo, the bench's zoo scenario).

Reading them is runtime: it needs neither the corpus nor the trainer. ``hsd_fast.zoo.build`` writes
them (``write_calibration``) by a fixed rule from the corpus's validation tokens.
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
