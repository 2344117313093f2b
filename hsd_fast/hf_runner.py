"""A runner for a Hugging Face causal LM: static preallocated KV cache written at explicit slots.

One forward feeds a fed block (``layout.py``: ``[B, L]`` right-aligned, a validity mask) and returns
the logits of its last O columns (``logits_to_keep``). Slots equal positions: row r's token at
position t lives in cache slot t; padding, and rows that sit this forward out, write their K/V to
a scratch slot and attend only to it (docs/design.md, "Padding and rows that sit out"), so they
change no state. The 4D mask is built here from the block's positions (additive, which SDPA and
eager both read correctly; eager misreads a bool mask: docs/design.md, "4D masks are used as is;
the eager + bool trap"), and explicit ``position_ids`` keep RoPE and learned positions right. All
of it is tensor code at the block's shapes, so a compiled step traces through it.
"""

from __future__ import annotations

import weakref

import torch
from transformers.cache_utils import Cache

from hsd_fast.compat import embeddable_ids, fit_logits
from hsd_fast.layout import FedBlock, capacity_bucket


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

    def reset(self) -> None:
        """Zero every buffer for a new run (see above: masked slots must hold no NaN)."""
        for buffer in (*self.keys, *self.values):
            buffer.zero_()

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # key_states, value_states: [B, H_kv, L, D]. An index_put_ (rows and slots as advanced
        # indices, so the written block is [B, L, H_kv, D]) rather than a scatter_: a compiled step
        # writes it in place, where a scatter_ made it copy the whole cache twice per layer.
        rows = torch.arange(self.slots.shape[0], device=self.slots.device)[:, None]  # [B, 1]
        self.keys[layer_idx][rows, :, self.slots] = key_states.transpose(1, 2)
        self.values[layer_idx][rows, :, self.slots] = value_states.transpose(1, 2)
        return self.keys[layer_idx], self.values[layer_idx]  # [B, H_kv, S, D]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # never consulted: every forward passes explicit position_ids and a 4D mask

    def __len__(self) -> int:
        return len(self.keys)


_RUNNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {vocab size: runner}


class HFRunner:
    """One level of the hierarchy backed by an HF causal LM."""

    def __init__(self, model: torch.nn.Module, vocab_size: int) -> None:
        self.model = model
        # The hierarchy's vocabulary: the target's. A draft's logits are cut or padded to it, and ids
        # it cannot embed are fed as a stand-in (docs/design.md, "Vocabularies").
        self.vocab_size = vocab_size
        self.stand_in = model.get_input_embeddings().weight.shape[0] < vocab_size
        self.dtype = next(model.parameters()).dtype
        self.cache: SlotCache | None = None
        self.scratch = 0

    @classmethod
    def of(cls, model: torch.nn.Module, vocab_size: int) -> HFRunner:
        """The runner of ``model``, kept while the model lives: its cache buffers and compiled steps
        serve every later ``generate`` call (a new runner would compile anew)."""
        runners = _RUNNERS.setdefault(model, {})
        if vocab_size not in runners:
            runners[vocab_size] = cls(model, vocab_size)
        return runners[vocab_size]

    def prepare(self, num_rows: int, capacity: int) -> None:
        config = self.model.config
        max_positions = getattr(config, "max_position_embeddings", None)
        if max_positions is not None and capacity > max_positions:
            raise ValueError(
                f"{type(self.model).__name__}: prompt + max_new_tokens needs {capacity} positions, beyond "
                f"its max_position_embeddings = {max_positions}"
            )
        slots = capacity_bucket(capacity)  # in the compiled steps' shapes: a few sizes only
        if max_positions is not None:
            slots = max(capacity, min(slots, max_positions))
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        param = next(self.model.parameters())
        self.scratch = slots  # slots 0..slots-1 hold positions; the last one is scratch
        shape = (num_rows, getattr(config, "num_key_value_heads", None) or heads, slots + 1, head_dim)
        if self.cache is not None and self.cache.keys[0].shape == shape:
            self.cache.reset()  # same shapes: reuse the buffers (and what was compiled for them)
        else:
            self.cache = SlotCache(config.num_hidden_layers, *shape, param.dtype, param.device)

    def forward(self, block: FedBlock, num_outputs: int) -> torch.Tensor:
        cache = self.cache
        assert cache is not None, "prepare() first"
        slot_ids = torch.arange(cache.keys[0].shape[2], device=block.positions.device)  # [S]
        write_slot = torch.where(block.valid, block.positions, self.scratch)  # [B, L]
        # A real token at position t sees slots 0..t (slot = position); padding sees the scratch slot.
        sees = torch.where(
            block.valid[..., None],
            slot_ids <= block.positions[..., None],
            slot_ids == self.scratch,
        )  # [B, L, S]
        dtype = cache.keys[0].dtype
        mask = torch.zeros(sees.shape, dtype=dtype, device=sees.device).masked_fill(
            ~sees, torch.finfo(dtype).min
        )
        cache.slots = write_slot
        input_ids = embeddable_ids(self.model, block.input_ids) if self.stand_in else block.input_ids
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask[:, None],  # [B, 1, L, S]
            position_ids=block.positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=num_outputs,
        )
        return fit_logits(out.logits, self.vocab_size)  # [B, O, V]
