"""Known bugs planted from outside the engine, so that the distribution tests can show they catch
them (a test that cannot fail proves nothing). Each is a context manager that patches one function
of the level steps."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import numpy as np
import torch

from hsd_fast import graph_cache, processors, steps, tree_steps
from hsd_fast.triton_kernels import tree_torch


@contextlib.contextmanager
def residual_stored_as_q() -> Iterator[None]:
    """Store normalize(max(0, p - q)) as a correction's q instead of p. A correction drawn from the
    residual is still marginally a sample of p, so p must be stored: with the residual the next
    level up verifies against the wrong q. Assumes temperature 1 (p = softmax of the logits)."""
    keep_emitted = steps.keep_emitted

    def buggy(state, rows, slots, logits, result) -> None:
        # slots: [B, D + 1], the trash slot where a column holds no emitted token
        emitted = slots != state.window
        num_drafts = emitted.sum(1) - 1  # [B] (-1 for rows that sat out)
        drafts = slots.shape[1] - 1
        rejected = (result.num_accepted < num_drafts) & (num_drafts > 0)  # [B]
        column = (drafts - num_drafts + result.num_accepted).clamp(0, drafts)  # the correction's
        slot = slots[rows, column]  # [B] holds the rejected draft's q until the original runs
        q = torch.softmax(state.q_logits[rows, slot].float(), -1)
        p = torch.softmax(logits[rows, column].float(), -1)
        keep_emitted(state, rows, slots, logits, result)
        log_residual = (p - q).clamp_min(0).log()  # [B, V]
        where = rows[rejected], slot[rejected]
        state.q_logits[where] = log_residual[rejected].to(state.q_logits.dtype)
        state.q_lse[where] = torch.logsumexp(log_residual[rejected], -1)

    with mock.patch.object(steps, "keep_emitted", buggy):
        yield


@contextlib.contextmanager
def vocabulary_cut_to_the_smallest() -> Iterator[None]:
    """The old padded-vocabulary rule: every level, the target included, samples over the smallest
    vocabulary of the hierarchy. The target's extra ids are then never drawn: its output is not its
    own when it gives them mass."""
    from hsd_fast import compat, request

    def smallest(target, drafts) -> int:
        compat.hierarchy_vocab_size(target, drafts)  # the same refusals
        return min(m.get_output_embeddings().weight.shape[0] for m in (target, *drafts))

    with mock.patch.object(request, "hierarchy_vocab_size", smallest):
        yield


@contextlib.contextmanager
def correction_drawn_from_p() -> Iterator[None]:
    """Draw a rejection's correction from the verifier's p instead of the residual max(p - q, 0).
    With a point-mass draft (a lookup proposal x) the residual is p with x removed: drawn from p,
    the rejected x can come back as its own correction, and the output over-weights it."""
    verify = steps.verify

    def buggy(
        verifier_logits, draft_logits, draft_lse, draft_tokens, num_drafts, temperature, *args, **kwargs
    ):
        result = verify(
            verifier_logits, draft_logits, draft_lse, draft_tokens, num_drafts, temperature, *args, **kwargs
        )
        rows = torch.arange(len(num_drafts), device=num_drafts.device)
        column = draft_tokens.shape[1] - num_drafts + result.num_accepted  # [B] the correction's
        p = torch.softmax(verifier_logits[rows, column].float() / temperature[:, None], -1)  # [B, V]
        from_p = torch.multinomial(p, 1)[:, 0]  # [B]
        rejected = result.num_accepted < num_drafts
        return result._replace(next_token=torch.where(rejected, from_p, result.next_token))

    with mock.patch.object(steps, "verify", buggy):
        yield


# ---------------------------------------------------------------- token trees (tree_torch, tree_steps)
@contextlib.contextmanager
def q_not_updated_after_a_rejected_sibling() -> Iterator[None]:
    """Planted bug (a): after a rejected sibling, p becomes the residual but q keeps the tried token."""
    after_rejection = tree_torch.after_rejection

    def buggy(p_weights, p_mass, q, x, logp, reject):
        p_weights, p_mass, _ = after_rejection(p_weights, p_mass, q, x, logp, reject)
        return p_weights, p_mass, q

    with mock.patch.object(tree_torch, "after_rejection", buggy):
        yield


@contextlib.contextmanager
def siblings_share_one_accept_uniform() -> Iterator[None]:
    """Planted bug (b): the accept test keyed by the position alone, so siblings share its uniform."""
    accept_uniform = tree_torch.accept_uniform

    def buggy(seeds, level, child_keys):
        return accept_uniform(seeds, level, child_keys & ((1 << tree_torch.COLUMN_SHIFT) - 1))

    with mock.patch.object(tree_torch, "accept_uniform", buggy):
        yield


@contextlib.contextmanager
def tree_residual_stored_as_q() -> Iterator[None]:
    """Planted bug (c): the token after a path stored with the residual max(0, p - q) it may have
    been drawn from (q: level 0's at that context), not with the verifier's p; level 2 then
    verifies it against the wrong q. Assumes temperature 1."""
    keep = tree_steps.keep_tree_emitted

    def buggy(state, tree_start, path, emitted, active, logits, lse) -> None:
        rows = torch.arange(len(tree_start))
        contexts = torch.cat([torch.zeros_like(path[:, :1]), path + 1], 1).clamp(min=0)
        context = contexts[rows, emitted.clamp(max=path.shape[1])]  # [B] where the extra token was drawn
        p = torch.softmax(logits[rows, context].float(), -1)
        q = torch.softmax(state.tree.q_logits[rows, context].float(), -1)
        residual = (p - q).clamp_min(0).log()  # [B, V]
        logits = logits.clone()
        logits[rows, context] = residual.to(logits.dtype)
        keep(state, tree_start, path, emitted, active, logits, torch.logsumexp(logits.float(), -1))

    with mock.patch.object(tree_steps, "keep_tree_emitted", buggy):
        yield


# ---------------------------------------------------------------- history processors (decode_state)
@contextlib.contextmanager
def penalty_history_without_the_blocks_drafts() -> Iterator[None]:
    """A history processor (the repetition penalty, the n-gram ban) at every output column of a step
    applied with the history of the step's first output column: a verifier's p after a draft then
    ignores the drafts before it (and a draft step, one column, is unchanged). The target's
    distribution at those positions is wrong, so is the output, not just the acceptance rate."""
    with _every_output_column_at_the_first("history_ids"):
        yield


@contextlib.contextmanager
def _every_output_column_at_the_first(method: str) -> Iterator[None]:
    """``DecodeState.<method>(block, num_outputs)`` answered as if every output column of the block
    stood at the position of its first one."""
    from hsd_fast.decode_state import DecodeState

    real = getattr(DecodeState, method)

    def buggy(self, block, num_outputs):
        fed = block.positions[:, :-num_outputs]
        first = block.positions[:, -num_outputs:][:, :1].expand(-1, num_outputs)
        return real(self, block._replace(positions=torch.cat([fed, first], 1)), num_outputs)

    with mock.patch.object(DecodeState, method, buggy):
        yield


@contextlib.contextmanager
def penalty_history_without_tree_ancestors() -> Iterator[None]:
    """A token tree's node gets the penalty with its row's prefix only, not its ancestors' tokens."""
    from hsd_fast.decode_state import DecodeState

    history_ids = DecodeState.history_ids

    def buggy(self, block, num_outputs):
        if block.tree_sees is None:
            return history_ids(self, block, num_outputs)
        return history_ids(self, block._replace(tree_sees=torch.zeros_like(block.tree_sees)), num_outputs)

    with mock.patch.object(DecodeState, "history_ids", buggy):
        yield


@contextlib.contextmanager
def lower_keys_never_change() -> Iterator[None]:
    """Switching hierarchies: every epoch keys the levels below the target like the first, so a
    policy that learnt a lower level's uniforms from the rounds it saw can choose on what that
    level will draw next."""
    from hsd_fast import sampling_metadata

    epoch_seeds = sampling_metadata._epoch_seeds  # what start_epoch and epoch_seeds both hash with
    with mock.patch.object(sampling_metadata, "_epoch_seeds", lambda seeds, epoch: epoch_seeds(seeds, 1)):
        yield


@contextlib.contextmanager
def runs_share_seeds() -> Iterator[None]:
    """Switching hierarchies: a policy's every run keyed like its first, so a policy that saw what a
    run with a seed drew can choose on what the next run with that seed will draw."""
    from hsd_fast import sampling_metadata

    with mock.patch.object(sampling_metadata, "run_seeds", lambda seeds, runs_before: seeds):
        yield


@contextlib.contextmanager
def joining_levels_skip_catch_up() -> Iterator[None]:
    """Switching hierarchies: a level that joins is told its cache holds the whole committed prefix
    (its stale cache kept as if it had followed the rounds it missed), so it never feeds them."""
    from hsd_fast.switching import Switcher

    def buggy(self, choice, committed):
        return np.broadcast_to(
            np.maximum(committed - 1, 0), (len(self.levels_of(choice)), len(committed))
        ).copy()

    with mock.patch.object(Switcher, "caches_for", buggy):
        yield


@contextlib.contextmanager
def lengths_one_token_late() -> Iterator[None]:
    """A length processor handed the ``input_ids`` width of the column's own position instead of the
    token it predicts: EOS stays banned one new token longer than ``min_new_tokens`` says, the begin
    tokens are suppressed at the second new token instead of the first."""
    from hsd_fast.decode_state import DecodeState

    lengths = DecodeState.lengths

    def buggy(self, block, num_outputs):
        return lengths(self, block._replace(positions=block.positions - 1), num_outputs)

    with mock.patch.object(DecodeState, "lengths", buggy):
        yield


@contextlib.contextmanager
def prefixes_of_the_steps_first_column() -> Iterator[None]:
    """A processor called per position handed, at every output column of a step, the prefix of the
    step's first output column: a verifier's p after a draft then ignores the drafts before it (as
    ``penalty_history_without_the_blocks_drafts`` does for the penalty)."""
    with _every_output_column_at_the_first("prefixes"):
        yield


@contextlib.contextmanager
def exit_not_caught_up() -> Iterator[None]:
    """Skip feeding an early exit the block's positions it has not cached before the level above
    verifies from its hidden states: the exit's last draft (drawn, never fed) is then read from a
    stale hidden state, one a rejected token left there or none at all."""
    from hsd_fast.level_step import LevelStep

    with mock.patch.object(LevelStep, "feed", lambda self, state, rows, starts, ends: 0.0):
        yield


@contextlib.contextmanager
def proposals_verified_as_drafts() -> Iterator[None]:
    """The level above a proposal level (a draft with another tokenizer, the lookup level) verifies
    its proposals against the ring's q, as if a model had drafted them, instead of as point masses:
    that q is whatever the ring holds at those slots, not the proposal's."""
    from hsd_fast.level_step import LevelStep

    build = LevelStep.of.__func__

    def buggy(cls, runner, level, top, compile=False, point_mass=False, tree_below=None):
        return build(cls, runner, level, top, compile, False, tree_below)

    with mock.patch.object(LevelStep, "of", classmethod(buggy)):
        yield


@contextlib.contextmanager
def proposal_q_one_slot_late() -> Iterator[None]:
    """A draft with another tokenizer sampling from the shared vocabulary hands up each proposal's q
    at the next position's ring slot: the level above verifies the first proposal against whatever
    the ring held there, and every later one against its predecessor's q."""
    from hsd_fast.decode_state import DecodeState

    keep = DecodeState.keep_proposal_q

    def buggy(self, rows, ends, counts, logits, lse) -> None:
        keep(self, rows, ends + 1, counts, logits, lse)

    with mock.patch.object(DecodeState, "keep_proposal_q", buggy):
        yield


@contextlib.contextmanager
def draft_seeds_by_batch_index() -> Iterator[None]:
    """The levels below the target key their randomness with the row seed plus the row's index in
    the batch: still fresh randomness, so the output is still distributed as the target's, but a row
    no longer samples the same tokens alone as in a batch."""
    from hsd_fast.sampling_metadata import SamplingMetadata

    build = SamplingMetadata.build.__func__

    def buggy(cls, num_rows, *args, **kwargs):
        metadata = build(cls, num_rows, *args, **kwargs)
        metadata.draft_seeds.add_(torch.arange(num_rows, device=metadata.draft_seeds.device))
        return metadata

    with mock.patch.object(SamplingMetadata, "build", classmethod(buggy)):
        yield


@contextlib.contextmanager
def trash_column_baked_in() -> Iterator[None]:
    """The token buffer's trash column is a Python int the run sets (as the steps had it before the
    capacity was symbolic): compiled steps keep no guards on ints, so a graph compiled at one
    capacity writes its sitting-out rows' tokens at that capacity's trash column in every later run,
    a real position once the buffer is larger."""
    from hsd_fast.decode_state import DecodeState

    init = DecodeState.__init__

    def buggy(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        self.trash = self.tokens.shape[1] - 1

    with mock.patch.object(DecodeState, "trash", None), mock.patch.object(DecodeState, "__init__", buggy):
        yield


@contextlib.contextmanager
def weights_keyed_on_shapes() -> Iterator[None]:
    """Admit packed weights to inductor's FX graph cache but name every weight in the key by its shape
    and dtype only (inductor's own key for a frozen weight): a model of the same shapes as a cached
    one loads the cached one's weights (the template's copies that a compiled graph stores)."""

    def on_shapes(t, model_digest):
        return ("packed weight", str(t.dtype), tuple(t.shape)) if t.is_mkldnn else None

    with mock.patch.object(graph_cache, "described", on_shapes):
        yield


@contextlib.contextmanager
def length_thresholds_baked_in() -> Iterator[None]:
    """The length processors' ops read their thresholds from the processor, as Python ints, while the
    steps' key no longer names them: a compiled step keeps the first request's thresholds for every
    later request of another prompt width or length."""
    length_op = processors._length_op

    def buggy(processor, scores, lengths, table):
        threshold = processors.LENGTH_THRESHOLDS[type(processor).__name__][0](processor)  # an int
        return length_op(processor, scores, lengths, table._replace(threshold=threshold))

    with mock.patch.object(processors, "_length_op", buggy):
        yield
