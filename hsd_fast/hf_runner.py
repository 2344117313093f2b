"""A runner for a Hugging Face causal LM: static preallocated KV cache written at explicit slots.

One forward feeds, for every row of the batch, the span of tokens the ledger says the level has not
cached yet. Spans are right-aligned in a ``[B, L]`` block (so ``logits_to_keep`` covers every row's
outputs); padding, and rows that sit this forward out, write their K/V to a scratch slot and attend only
to it (docs/design.md, "Padding and rows that sit out"), so they change no state. Slots equal positions:
row r's token at position t lives in cache slot t. The 4D mask is built here for the model's attention
implementation (additive, which SDPA and eager both read correctly; eager misreads a bool mask:
docs/design.md, "4D masks are used as is; the eager + bool trap"), and explicit ``position_ids`` keep
RoPE and learned positions right. """

from __future__ import annotations

import numpy as np
import torch
from transformers.cache_utils import Cache

from hsd_fast.engine import Feed, ragged_arange
from hsd_fast.processors import LogitsTransform


class SlotCache(Cache):
    """K/V buffers ``[B, H_kv, S, D]`` per layer; ``update`` scatters at ``self.slots`` ([B, L]).

    Overrides the ``Cache`` level only (``update``, ``get_seq_length``, ``__len__``): the layer
    internals differ between transformers releases (docs/design.md, "A Cache subclass at the Cache level")."""

    def __init__(
        self,
        num_layers: int,
        batch: int,
        kv_heads: int,
        slots: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__(layers=[])
        # Zero-initialised: a NaN in a masked slot would still poison SDPA.
        shape = (batch, kv_heads, slots, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.slots = torch.zeros(batch, 0, dtype=torch.int64, device=device)  # [B, L]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # key_states, value_states: [B, H_kv, L, D]
        index = self.slots[:, None, :, None].expand_as(key_states)
        self.keys[layer_idx].scatter_(2, index, key_states)
        self.values[layer_idx].scatter_(2, index, value_states)
        return self.keys[layer_idx], self.values[layer_idx]  # [B, H_kv, S, D]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # never consulted: every forward passes explicit position_ids and a 4D mask

    def __len__(self) -> int:
        return len(self.keys)


class HFRunner:
    """One level of the hierarchy backed by an HF causal LM."""

    def __init__(self, model: torch.nn.Module, transform: LogitsTransform, vocab_size: int) -> None:
        self.model = model
        self.transform = transform
        self.vocab_size = vocab_size  # the hierarchy's common vocabulary (extra logits are cut)
        self.cache: SlotCache | None = None
        self.scratch = 0

    def prepare(self, num_rows: int, capacity: int) -> None:
        config = self.model.config
        max_positions = getattr(config, "max_position_embeddings", None)
        if max_positions is not None and capacity > max_positions:
            raise ValueError(
                f"{type(self.model).__name__}: prompt + max_new_tokens + speculative overshoot needs "
                f"{capacity} positions, beyond its max_position_embeddings = {max_positions}"
            )
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        param = next(self.model.parameters())
        self.scratch = capacity  # slots 0..capacity-1 hold positions; the last one is scratch
        self.cache = SlotCache(
            config.num_hidden_layers,
            num_rows,
            getattr(config, "num_key_value_heads", None) or heads,
            capacity + 1,
            head_dim,
            param.dtype,
            param.device,
        )

    def _t(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.cache.keys[0].device)

    @torch.inference_mode()
    def forward(self, feed: Feed) -> torch.Tensor:
        cache = self.cache
        assert cache is not None, "prepare() first"
        device = cache.keys[0].device
        num_rows, slots = cache.keys[0].shape[0], cache.keys[0].shape[2]
        # Right-aligned layout: position t of row j sits in column width - (ends[j] - t).
        width = int((feed.ends - feed.starts).max())
        owner, pos = ragged_arange(feed.starts, feed.ends)
        row_t, pos_t = self._t(feed.rows[owner]), self._t(pos)
        col_t = self._t(width - feed.ends[owner] + pos)

        input_ids = torch.zeros(num_rows, width, dtype=torch.int64, device=device)  # [B, L]
        position_ids = torch.zeros(num_rows, width, dtype=torch.int64, device=device)  # [B, L]
        write_slot = torch.full((num_rows, width), self.scratch, device=device)  # [B, L]
        input_ids[row_t, col_t] = feed.tokens
        position_ids[row_t, col_t] = pos_t
        write_slot[row_t, col_t] = pos_t
        valid = write_slot != self.scratch  # [B, L]
        # A real token at position t sees slots 0..t (slot = position); padding sees the scratch slot.
        slot_ids = torch.arange(slots, device=device)  # [S]
        sees = torch.where(
            valid[..., None],
            slot_ids[None, None, :] <= position_ids[..., None],
            slot_ids[None, None, :] == self.scratch,
        )  # [B, L, S]
        dtype = cache.keys[0].dtype
        mask = torch.zeros(sees.shape, dtype=dtype, device=device)
        mask.masked_fill_(~sees, torch.finfo(dtype).min)
        cache.slots = write_slot

        keep = int(feed.num_outputs.max())
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask[:, None],  # [B, 1, L, S]
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=keep,
        )
        logits = out.logits[..., : self.vocab_size]  # [B, keep, V]
        # The kept window is right-aligned too: position t of row j sits in column keep - (ends[j] - t).
        o_owner, o_pos = ragged_arange(feed.out_starts, feed.ends)
        picked = logits[self._t(feed.rows[o_owner]), self._t(keep - feed.ends[o_owner] + o_pos)]
        return self.transform(picked)  # [N, V]
