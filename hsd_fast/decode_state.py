"""The state of one run on the device: every row's tokens by position, the ring of draft
distributions the levels verify against, and a token tree's pending nodes. The level steps read and
write it; ``structure`` is what a compiled step is built for besides tensor shapes.

Shapes: B rows in the run, V vocabulary, S token positions, W ring slots.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from hsd_fast.buffer_pool import POOL
from hsd_fast.layout import FedBlock, capacity_buffer, capacity_key
from hsd_fast.processors import Lengths, LogitsTransform, Prefixes, ProcessorInputs
from hsd_fast.sampling_metadata import SamplingMetadata
from hsd_fast.target_outputs import NO_OUTPUTS, OutputRequest, TargetOutputs
from hsd_fast.tree_plan import TreeBuffers


class DecodeState:
    """The tensors of one run: every row's tokens by position and, for every speculative position,
    the distribution of the level that tagged it (processed logits + fp32 log-sum-exp) in a ring of
    W slots: the ``q`` the next level up verifies against. Greedy runs need no ring."""

    def __init__(
        self,
        prompts: Sequence[torch.Tensor],
        capacity: int,
        window: int,
        vocab: int,
        ring_dtype: torch.dtype,
        sampling: SamplingMetadata,
        transform: LogitsTransform,
        keep_q: bool,
        outputs: OutputRequest = NO_OUTPUTS,
        max_new: int = 0,
    ) -> None:
        num_rows, device = len(prompts), prompts[0].device
        self.sampling, self.transform, self.window = sampling, transform, window
        tokens = POOL.zeros(self, (num_rows, capacity + 1), torch.int64, device)  # [B, S + 1]
        self.tokens = capacity_buffer(tokens, 1)
        for r, p in enumerate(prompts):
            self.tokens[r, : p.numel()] = p
        self.q_logits = self.q_lse = None
        if keep_q:  # slot W is the trash slot
            ring = (num_rows, window + 1, vocab)  # [B, W + 1, V]
            self.q_logits = POOL.zeros(self, ring, ring_dtype, device)
            self.q_lse = POOL.zeros(self, (num_rows, window + 1), torch.float32, device)  # [B, W + 1]
        # Per history source (``LogitsTransform.history_sources``): the padding ids it counts [B, P']
        # and the first unpadded position it counts [B] (``LogitsTransform.prompt_history``)
        self.vocab = vocab
        self.history = transform.prompt_history(num_rows, vocab, device) if transform.needs_history else []
        # Everything a step's code depends on besides the shapes of B, the widths and the vocabulary: a
        # compiled step is built per structure and guards on tensors only (see LevelStep), so a shape
        # that varies otherwise (the EOS ids, the counted padding) is part of it; a step whose graph
        # dynamo rebuilt on its own would be compiled without the step's settings, and silently.
        ring = window if keep_q else None
        outputs_key = (outputs.scores, outputs.logits, max_new if outputs else None)  # [B, max_new + 1, V]
        self.chain_structure = (
            ring,
            capacity_key(capacity, device),
            sampling.greedy,
            keep_q,
            transform.key,
            str(ring_dtype),
            outputs_key,
            len(sampling.eos_ids),
            tuple(padding.shape[1] for padding, _ in self.history),
        )
        self.structure = self.chain_structure
        self.tree: TreeBuffers | None = None  # a token tree's pending nodes (level 0 drafts trees)
        # step shapes to compile once the run is over (an adaptive run): (LevelStep, kind, widths, tree)
        self.deferred: set[tuple] | None = None
        # steps of a compiled run that ran eagerly while their shape waited to compile (warm-up)
        self.warm_up_steps = 0
        # HF's input_ids width before each row's first new token [B] (length processors read it)
        self.prompt_lengths = torch.tensor([p.numel() for p in prompts], dtype=torch.int64)
        self.prompt_widths = transform.prompt_widths(self.prompt_lengths).to(device)
        self.prompt_lengths = self.prompt_lengths.to(device)
        # What the sequence bias and length processors read besides the scores, built once per run
        self.processor_tables = transform.tables(vocab, capacity + 1, device)  # a width <= capacity
        # Per row, the padding HF's input_ids put before the prompt (processors called per position
        # see it, as HF's do): [P_r] int64 on the host
        self.hf_padding = transform.prompt_padding(prompts) if transform.needs_prefixes else []
        # The target's scores / logits at every token it emits (output_scores / output_logits)
        self.outputs = None
        if outputs:
            self.outputs = TargetOutputs(outputs, self.prompt_lengths, max_new, vocab, transform.temperature)

    @property
    def trash(self) -> int | torch.SymInt:
        """The token buffer's last column, where rows that sit a step out write: read from the
        buffer's size, which a compiled step may trace as a symbol (``layout.capacity_buffer``)."""
        return self.tokens.shape[1] - 1

    def set_tree(self, buffers: TreeBuffers | None) -> None:
        """Level 0 drafts token trees of this topology, kept in ``buffers`` (None: chains again, after
        a switch of hierarchy); the topology is part of what a compiled step is built for."""
        self.tree = buffers
        tree = () if buffers is None else (buffers.plan.tree.parents,)
        self.structure = (*self.chain_structure, *tree)

    def history_ids(self, block: FedBlock, num_outputs: int) -> list[torch.Tensor]:
        """Per history source, ``[B * O, K]`` int64: the token ids the history of each of the
        block's last O columns holds (the vocabulary size V where an entry holds none), the
        distribution there being for the token after it. A chain column at position t: the row's
        tokens at positions ``first .. t`` (prompt, commits and the drafts before it, as the token
        buffer holds them); a tree node: the row's tokens up to ``tree_start - 1`` and the node's
        ancestors and itself (``tree_sees``). Plus the padding ids HF's processor counts. Recomputed
        from the buffers at every step (a rollback needs no undo): ``K = P + S + 1 (+ n)`` ids per
        column, no host sync, static shapes. Padding columns and rows that sit out get some history;
        their logits are never read."""
        tokens, vocab = self.tokens, self.vocab  # [B, S + 1]
        last = block.positions[:, -num_outputs:]  # [B, O] the position of each output's fed token
        if block.tree_start is not None:  # tree nodes: the chain part of their history ends at P - 1
            last = torch.minimum(last, block.tree_start[:, None] - 1)
        at = torch.arange(tokens.shape[1], device=tokens.device)  # [S + 1]
        out = []
        for padding, first in self.history:
            counted = (at >= first[:, None, None]) & (at <= last[..., None])  # [B, O, S + 1]
            parts = [
                padding[:, None, :].expand(-1, num_outputs, -1),  # [B, O, P]
                torch.where(counted, tokens[:, None, :], vocab),
            ]
            if block.tree_sees is not None:
                assert self.tree is not None
                sees = block.tree_sees[:, -num_outputs:]  # [B, O, n]
                parts.append(torch.where(sees, self.tree.tokens[:, None, :], vocab))
            out.append(torch.cat(parts, -1).flatten(0, 1))  # [B * O, K]
        return out

    def prefixes(self, block: FedBlock, num_outputs: int) -> Prefixes:
        """For each of the block's last O columns, row-major, the ``input_ids`` HF's unassisted
        ``generate`` would hand a processor predicting the token after it: the row's padding, then
        its tokens up to the column's position (a chain, drafts included) or up to the tree's start
        and the node's ancestors and itself (a tree node), as ``history_ids`` counts them. None for a
        column that holds no valid token or predicts a prompt token (a verification's leading
        columns, never read): a processor only sees prefixes HF's would, and drafted ones.
        Host-side: one copy of the buffers per step."""
        positions = block.positions[:, -num_outputs:].tolist()  # [B][O]
        valid = block.valid[:, -num_outputs:].tolist()
        tokens, prompt_lengths = self.tokens.cpu(), self.prompt_lengths.tolist()
        tree = block.tree_start is not None
        if tree:
            assert self.tree is not None
            starts = block.tree_start.tolist()
            sees = block.tree_sees[:, -num_outputs:].cpu()  # [B, O, n]
            nodes = self.tree.tokens.cpu()  # [B, n]
        rows, ids = [], []
        for r, row_positions in enumerate(positions):
            for o, t in enumerate(row_positions):
                rows.append(r)
                if not valid[r][o] or t + 1 < prompt_lengths[r]:
                    ids.append(None)
                    continue
                parts = [self.hf_padding[r], tokens[r, : (min(t, starts[r] - 1) if tree else t) + 1]]
                if tree:
                    parts.append(nodes[r][sees[r, o]])
                ids.append(torch.cat(parts))
        return Prefixes(rows, ids)

    def lengths(self, block: FedBlock, num_outputs: int) -> Lengths:
        """For the block's last O columns, row-major ``[B * O]``: HF's ``input_ids`` width where the
        column's token is predicted and the row's new tokens before it. A column at position t predicts
        the row's new token number ``t + 1 - prompt length`` (0 the first); tree nodes stand at their
        depth's position, so they are counted the same way."""
        new = block.positions[:, -num_outputs:] + 1 - self.prompt_lengths[:, None]  # [B, O]
        return Lengths((self.prompt_widths[:, None] + new).flatten(), new.flatten())

    def processor_inputs(self, block: FedBlock, num_outputs: int) -> ProcessorInputs:
        """What the transform's processors read at the block's last O columns besides the scores."""
        transform = self.transform
        return ProcessorInputs(
            self.history_ids(block, num_outputs) if transform.needs_history else None,
            self.lengths(block, num_outputs) if transform.needs_lengths else None,
            self.prefixes(block, num_outputs) if transform.needs_prefixes else None,
            self.processor_tables,
        )

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]

    def ring_slot(self, positions: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The ring slot of each position, or the trash slot where ``keep`` is false."""
        return torch.where(keep, positions % self.window, self.window)

    def keep_p(
        self, rows: torch.Tensor, slots: torch.Tensor, logits: torch.Tensor, lse: torch.Tensor
    ) -> None:
        """Store distributions (logits [..., V] and their fp32 log-sum-exp) at ring slots."""
        assert self.q_logits is not None and self.q_lse is not None
        self.q_logits[rows, slots] = logits.to(self.q_logits.dtype)
        self.q_lse[rows, slots] = lse

    def keep_proposal_q(
        self,
        rows: np.ndarray,  # [R]
        ends: np.ndarray,  # [R]
        counts: np.ndarray,  # [R]
        logits: torch.Tensor,  # [R, W, V'] V' <= V: ids from V' on have no mass
        lse: torch.Tensor,  # [R, W] fp32
    ) -> None:
        """Keep the q that proposals were drawn from at their ring slots (row ``rows[i]``'s first
        ``counts[i]`` columns, at positions ``ends[i]``, ...), for the level above to verify them."""
        device = self.tokens.device
        offsets = torch.arange(logits.shape[1], device=device)  # [W]
        taken = offsets < torch.from_numpy(counts).to(device)[:, None]  # [R, W]
        positions = torch.from_numpy(ends).to(device)[:, None] + offsets  # [R, W]
        logits, lse = logits.to(device), lse.to(device)  # the draft's device may be another
        if logits.shape[-1] < self.vocab:
            logits = torch.nn.functional.pad(logits, (0, self.vocab - logits.shape[-1]), value=-torch.inf)
        self.keep_p(torch.from_numpy(rows).to(device)[:, None], self.ring_slot(positions, taken), logits, lse)

    def write_proposals(
        self,
        rows: np.ndarray,  # [R]
        ends: np.ndarray,  # [R]
        proposals: np.ndarray,  # [R, W] row i's first counts[i] entries proposed
        counts: np.ndarray,  # [R]
    ) -> None:
        """Put a proposal level's proposals (row ``rows[i]``'s at positions ``ends[i]``, ``ends[i] +
        1``, ...) into the token buffer. Their q is not written: a point mass on each token, which
        the level above verifies in the op's point-mass mode (docs/design.md, "The lookup level"),
        or the q they were drawn from (``keep_proposal_q``)."""
        offsets = np.arange(proposals.shape[1])  # [W]
        taken = offsets < counts[:, None]  # [R, W]
        if not taken.any():
            return
        at_row = np.broadcast_to(rows[:, None], taken.shape)[taken]  # [N] over all proposed tokens
        positions = (ends[:, None] + offsets)[taken]  # [N]
        if self.tokens.device.type == "cpu":  # written through numpy: a fifth of the tensor ops' time
            self.tokens.numpy()[at_row, positions] = proposals[taken]
            return
        device = self.tokens.device
        self.tokens[torch.from_numpy(at_row).to(device), torch.from_numpy(positions).to(device)] = (
            torch.from_numpy(proposals[taken]).to(device)
        )
