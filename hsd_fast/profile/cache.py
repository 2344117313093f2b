"""Measured forward costs and acceptance rates, cached in JSON across runs and machines.

Keys name what was measured: a cost by model identity (a hash of the weights), device, dtype and
context length; an acceptance rate by the unordered pair of identities, the sampling transform and
the hash of the calibration ids. ``fallbacks`` (e.g. the zoo's committed CPU profile) are read but
never written.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from hsd_fast.processors import LogitsTransform
from hsd_fast.profile.acceptance_rates import acceptance
from hsd_fast.profile.costs import CostProfile, forward_costs


def model_identity(model: torch.nn.Module) -> str:
    """A short hash of the weights as loaded (class, parameter names, shapes, dtype and a strided
    sample of every parameter): the same checkpoint gives the same key on every machine."""
    digest = hashlib.sha256(type(model).__name__.encode())
    for name, p in sorted(model.named_parameters()):
        flat = p.detach().flatten()
        sample = flat[:: max(1, flat.numel() // 4096)].float().cpu().numpy()
        digest.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
        digest.update(sample.tobytes())
    return digest.hexdigest()[:16]


def ids_hash(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.to(torch.int64).cpu().numpy().tobytes()).hexdigest()[:16]


def sampling_key(transform: LogitsTransform, greedy: bool) -> str:
    """``"greedy"``, or ``"sample "`` followed by the transform's settings."""
    return "greedy" if greedy else f"sample {transform.key}"


class ProfileCache:
    """Costs and acceptance rates, measured on first request and kept in ``path`` (JSON)."""

    def __init__(self, path: Path | None = None, fallbacks: Sequence[Path] = ()) -> None:
        self.path, self.entries = path, {}
        for source in [*fallbacks, path]:
            if source is not None and Path(source).is_file():
                self.entries.update(json.loads(Path(source).read_text())["entries"])

    def save(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps({"entries": self.entries}, indent=1, sort_keys=True) + "\n")

    def costs(
        self,
        model: torch.nn.Module,
        context: int,
        compile: bool = False,
        transform: LogitsTransform | None = None,
        greedy: bool = True,
        **kwargs,
    ) -> CostProfile:
        """``model``'s step costs at ``context`` cached tokens, on the path ``generate`` takes
        (compiled or not, greedy or sampled under ``transform``)."""
        transform = transform or LogitsTransform()
        p = next(model.parameters())
        key = (
            f"cost {model_identity(model)} {p.device.type} {str(p.dtype).removeprefix('torch.')} {context} "
            f"{'compiled' if compile else 'eager'} {sampling_key(transform, greedy)}"
        )
        if key not in self.entries:
            profile = forward_costs(
                model, context=context, compile=compile, greedy=greedy, transform=transform, **kwargs
            )
            self.entries[key] = {
                "spans": list(profile.spans),
                "seconds": list(profile.seconds),
                "drafts": list(profile.drafts),
                "draft_seconds": list(profile.draft_seconds),
            }
        entry = self.entries[key]
        return CostProfile(*(tuple(entry[k]) for k in ("spans", "seconds", "drafts", "draft_seconds")))

    def acceptance(
        self,
        models: Sequence[torch.nn.Module],
        ids: torch.Tensor,
        transform: LogitsTransform,
        greedy: bool,
        progress: bool = True,
    ) -> list[list[float]]:
        names = [model_identity(m) for m in models]
        sampling = sampling_key(transform, greedy)
        keys = {
            (j, m): f"alpha {' '.join(sorted((names[j], names[m])))} {sampling} {ids_hash(ids)}"
            for j, m in itertools.combinations(range(len(models)), 2)
        }
        if any(key not in self.entries for key in keys.values()):
            alpha = acceptance(models, ids, transform, greedy=greedy, progress=progress)
            self.entries.update({key: alpha[j][m] for (j, m), key in keys.items()})
        alpha = [[1.0] * len(models) for _ in models]
        for (j, m), key in keys.items():
            alpha[j][m] = alpha[m][j] = self.entries[key]
        return alpha
