"""The run buffers that compiled steps write in place: zeroed, marked static for CUDA graphs, and
handed from a finished run to the next run of the same shapes (docs/design.md, "Compiled steps")."""

from __future__ import annotations

import weakref

import torch


def graph_buffer(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, a buffer that compiled steps write in place, marked on CUDA as a static input.
    Inductor's CUDA graphs (cudagraph trees) skip every graph that mutates an input not marked so:
    without the mark no compiled step replays from a graph. A new buffer in a marked input's place
    (the next run's) makes the graph record again (docs/design.md, "Compiled steps")."""
    if tensor.is_cuda:
        torch._dynamo.mark_static_address(tensor, guard=False)
    return tensor


class BufferPool:
    """Zeroed buffers for a run, taken from finished runs of the same shapes where it can. On CUDA a
    compiled step's graph is recorded for the addresses of the buffers it writes, and a run that
    brings new ones makes every graph record again (an extra run of each step, and one more
    recorded graph kept for each, request after request): reusing a finished run's buffers keeps the
    addresses. A buffer returns to the pool when the object that took it is collected, so two live
    runs never share one; the pool keeps the free buffers of its ``max_shapes`` most recent shapes.
    Pools on ``device_types`` only (a CPU has no graphs to keep)."""

    def __init__(self, device_types: frozenset[str] = frozenset({"cuda"}), max_shapes: int = 4) -> None:
        self.device_types, self.max_shapes = device_types, max_shapes
        self._free: dict[tuple, list[torch.Tensor]] = {}  # shape key -> free buffers, oldest key first

    def zeros(
        self, owner: object, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A zeroed ``shape`` buffer that belongs to ``owner`` until ``owner`` is collected."""
        if device.type not in self.device_types:
            return torch.zeros(shape, dtype=dtype, device=device)
        key = (tuple(shape), dtype, device)
        free = self._free.pop(key, [])
        self._keep(key, free)  # the most recent shape now
        buffer = free.pop().zero_() if free else graph_buffer(torch.zeros(shape, dtype=dtype, device=device))
        weakref.finalize(owner, self._give_back, key, buffer)
        return buffer

    @property
    def free_buffers(self) -> int:
        """How many buffers the pool holds for later runs."""
        return sum(len(free) for free in self._free.values())

    def _give_back(self, key: tuple, buffer: torch.Tensor) -> None:
        free = self._free.pop(key, [])
        free.append(buffer)
        self._keep(key, free)

    def _keep(self, key: tuple, free: list[torch.Tensor]) -> None:
        self._free[key] = free
        while len(self._free) > self.max_shapes:
            del self._free[next(iter(self._free))]


POOL = BufferPool()
"""The buffers of every run's ``DecodeState`` and token-tree buffers."""
