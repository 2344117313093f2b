"""The level steps of a token tree at level 0 (docs/design.md, "Token trees in the engine").

Level 0 drafts the tree depth by depth (``tree_draft_step``); level 1 verifies it in one forward
(``tree_verify_step``), writes the accepted path and the token after it into the token buffer as an
ordinary chain, and moves the path's K/V, in its own cache and in level 0's, from the tree slots to
the slots of the positions the path now stands at. To the ledger the tree is a *proposal* of
``depth`` tokens (as a lookup level's is): level 1 then reports how many it accepted, so the ledger,
the levels above and the ring of q's see a chain as usual.

Terms (``hsd_fast.tree`` and ``triton_kernels/tree_torch.py`` define the rest; ``tree_plan.py`` holds
the tree's index tensors and every row's pending nodes):

    P           per row, the position of the tree's first depth (the row's length when it drafts)
    tree slots  ``[P, P + n)`` in the caches of levels 0 and 1: node j's K/V sit at slot P + j
                while the tree is pending; a node's *position* is P + depth_j
    max_depth   per row, the nodes the ledger took (``min(depth, room left in the length budget)``):
                deeper nodes are drafted but never accepted

Shapes: B rows, n nodes, V vocabulary, C catch-up columns (a bucket), K = depth of the tree.
"""

from __future__ import annotations

import torch

from hsd_fast.decode_state import DecodeState
from hsd_fast.layout import FedBlock, fed_block
from hsd_fast.steps import Runner, broken_logits, point_masses_where_broken, processed_logits, step_result
from hsd_fast.tree_plan import TreePlan
from hsd_fast.triton_kernels.tree_torch import draft_children_torch, node_key, verify_tree_torch


def _node_block(
    plan: TreePlan,
    nodes: slice,  # the nodes fed (contiguous: a depth, or the whole tree)
    tokens: torch.Tensor,  # [B, n]
    tree_start: torch.Tensor,  # [B] P
    max_depth: torch.Tensor,  # [B]
    valid: torch.Tensor,  # [B] bool
) -> FedBlock:
    """The ``[B, m]`` block of tree nodes ``nodes``, cached at their tree slots. A node deeper than
    the row's ``max_depth`` is fed at the last position the row may use: it is never accepted, and a
    model with a learned position table must not read past it."""
    index = torch.arange(nodes.start, nodes.stop, device=tokens.device)  # [m]
    deepest = tree_start + (max_depth - 1).clamp(min=-1)  # [B] (P - 1 when nothing may be accepted)
    positions = torch.minimum(tree_start[:, None] + plan.depths[index], deepest[:, None])  # [B, m]
    valid = valid[:, None].expand(-1, len(index))  # [B, m]
    return FedBlock(
        input_ids=torch.where(valid, tokens[:, index], 0),
        positions=torch.where(valid, positions, 0),
        valid=valid,
        slots=tree_start[:, None] + index,
        tree_start=tree_start,
        tree_sees=plan.ancestors[index].expand(len(tree_start), -1, -1),  # [B, m, n]
    )


def _draft_children(
    state: DecodeState,
    group: tuple[torch.Tensor, torch.Tensor],  # contexts [m], children [m, k]
    logits: torch.Tensor,  # [B, m, V] level 0's processed logits at those contexts
    tree_start: torch.Tensor,  # [B]
    going: torch.Tensor,  # [B] bool
) -> None:
    """Draw the children of a group of contexts with the same number of children (keyed by each
    context), into the tree buffer; rows that sit out keep theirs."""
    contexts, children = group
    plan, buffers, meta = state.tree.plan, state.tree, state.sampling
    num_rows, m, k = len(tree_start), len(contexts), children.shape[1]
    node = (contexts - 1).clamp(min=0)  # [m] the node a context is (the root: 0, unused)
    keys = torch.where(
        contexts == 0,
        node_key(tree_start, 0)[:, None],
        node_key(tree_start[:, None] + plan.depths[node] + 1, plan.columns[node]),
    )  # [B, m]
    drawn, _ = draft_children_torch(
        logits.flatten(0, 1), k, meta.temperature[:, None].expand(-1, m).flatten(),
        meta.draft_seeds[:, None].expand(-1, m).flatten(), keys.flatten(), 0, meta.greedy,
    )  # fmt: skip
    drawn = drawn.view(num_rows, m * k)  # [B, m * k]
    flat = children.flatten()  # [m * k]
    buffers.tokens[:, flat] = torch.where(going[:, None], drawn, buffers.tokens[:, flat])
    if buffers.q_logits is not None:
        kept = buffers.q_logits[:, contexts]  # [B, m, V]
        buffers.q_logits[:, contexts] = torch.where(going[:, None, None], logits.to(kept.dtype), kept)


def tree_draft_step(
    runner: Runner,
    state: DecodeState,
    spans: torch.Tensor,  # [5, B] int64 per row: starts, ends, outs, active (0/1), nodes the ledger takes
    *,
    width: int,
) -> torch.Tensor:  # [3, B]
    """Level 0: feed the row's catch-up span, draw the root's children, then feed each depth but the
    last and draw its nodes' children: one forward per depth. Returns [3, B]: the nodes the ledger
    takes (``min(depth, wanted)``, or fewer: the depths drawn before broken logits), no EOS flag (an
    EOS node ends a path at verification), and whether any logits drawn from were broken."""
    starts, ends, wanted = spans[0], spans[1], spans[4]
    going = spans[3].bool() & (wanted > 0)  # [B]
    plan, tree = state.tree.plan, state.tree.plan.tree
    tree_start = ends  # [B] P: the first depth stands at the row's length
    max_depth = torch.where(going, wanted.clamp(max=tree.depth), 0)  # [B]
    logits = processed_logits(
        runner, state, fed_block(state.tokens, starts, ends, going, width), 1
    )  # [B, 1, V]
    # Broken logits (docs/design.md, "Why it is exact") at some depth's parents: the ledger takes only
    # the depths above, whose nodes were drawn before them.
    broken = broken_logits(logits[:, 0], going)
    max_depth = torch.where(broken, 0, max_depth)
    _draft_children(state, plan.groups[0][0], logits, tree_start, going)
    for d in range(1, tree.depth):
        fed = tree.depth_slice(d - 1)
        block = _node_block(plan, fed, state.tree.tokens, tree_start, max_depth, going)
        logits = processed_logits(runner, state, block, fed.stop - fed.start)  # [B, width of d - 1, V]
        bad = broken_logits(logits, going[:, None].expand(-1, logits.shape[1]))  # [B]
        broken, max_depth = broken | bad, torch.where(bad, max_depth.clamp(max=d), max_depth)
        for group in plan.groups[d]:
            _draft_children(state, group, logits[:, group[0] - 1 - fed.start], tree_start, going)
    return torch.stack([max_depth, torch.zeros_like(max_depth), broken.long()])


def tree_verify_step(
    runner: Runner,
    below: Runner,
    state: DecodeState,
    spans: torch.Tensor,  # [5, B] int64 per row: starts, ends, outs, active; the tree at [outs + 1, ends)
    *,
    width: int,
    keep_q: bool,
    below_target: bool,
) -> torch.Tensor:  # [3 + K, B]
    """Level 1: feed the catch-up span and the whole tree, verify it (recursive rejection sampling,
    ``verify_tree_torch``), write the accepted path and the correction or bonus at positions
    ``P, P + 1, ...``, move the path's K/V in this level's and level 0's caches to those slots, and
    (``keep_q``) keep this level's p for every token it emitted.

    An accepted EOS node ends the path with no token after it; it is reported as the path without
    it plus the EOS as the extra token, which is what a chain's ledger expects. Returns [3 + K, B]:
    accepted counts, EOS flags, broken-logits flags, then the rank of the accepted node at each
    depth (-1 past the path)."""
    starts, ends, outs, active = spans[0], spans[1], spans[2], spans[3].bool()
    plan, buffers, meta = state.tree.plan, state.tree, state.sampling
    tree, n = plan.tree, plan.tree.num_nodes
    rows = torch.arange(state.num_rows, device=ends.device)
    tree_start = outs + 1  # [B] P
    max_depth = torch.where(active, ends - tree_start, 0)  # [B]
    chain = fed_block(state.tokens, starts, tree_start, active, width)  # [B, C]: its last column is the root
    nodes = _node_block(plan, slice(0, n), buffers.tokens, tree_start, max_depth, active)
    block = FedBlock(
        torch.cat([chain.input_ids, nodes.input_ids], 1),
        torch.cat([chain.positions, nodes.positions], 1),
        torch.cat([chain.valid, nodes.valid], 1),
        slots=torch.cat([chain.positions, nodes.slots], 1),
        tree_start=tree_start,
        tree_sees=torch.cat([nodes.tree_sees.new_zeros(len(rows), width, n), nodes.tree_sees], 1),
    )  # [B, C + n]
    logits, raw = processed_logits(runner, state, block, n + 1, with_raw=True)  # [B, n + 1, V] root, nodes
    stops = (buffers.tokens[..., None] == meta.eos_ids).any(-1)  # [B, n]
    result = verify_tree_torch(
        logits, buffers.q_logits, buffers.tokens, tree, meta.temperature, meta.seeds_at(below_target),
        tree_start, 1, meta.greedy, max_depth=max_depth, stops=stops,
    )  # fmt: skip
    path, accepted = result.path, torch.where(active, result.num_accepted, 0)  # [B, K], [B]
    at_last = (accepted - 1).clamp(min=0)[:, None]  # [B, 1] the path's last depth
    ends_on_eos = (accepted > 0) & stops[rows, path.gather(1, at_last)[:, 0].clamp(min=0)]  # [B]
    depth = torch.arange(tree.depth, device=ends.device)  # [K]
    on_path = depth < accepted[:, None]  # [B, K]
    path_tokens = buffers.tokens.gather(1, path.clamp(min=0))  # [B, K]
    state.tokens[rows[:, None], torch.where(on_path, tree_start[:, None] + depth, state.trash)] = path_tokens
    extra_at = torch.where(active & ~ends_on_eos, tree_start + accepted, state.trash)  # [B]
    state.tokens[rows, extra_at] = result.next_token
    for level_runner in (runner, below):
        level_runner.move(tree_start, path.clamp(min=0), accepted)
    emitted = accepted - ends_on_eos.long()  # [B] drafts accepted, to the ledger
    if keep_q:
        keep_tree_emitted(state, tree_start, path, emitted, active, logits, result.verifier_lse)
    if state.outputs is not None and not below_target:  # the target: the path, then the extra token
        contexts = path_contexts(path)  # [B, K + 1]
        columns = torch.arange(tree.depth + 1, device=ends.device)  # [K + 1]
        kept = active[:, None] & (columns <= emitted[:, None])  # [B, K + 1]
        at = rows[:, None], contexts
        state.outputs.keep(tree_start[:, None] + columns, kept, logits[at], raw[at])
    extra = torch.where(ends_on_eos, path_tokens.gather(1, at_last)[:, 0], result.next_token)  # [B]
    used = active[:, None].expand(-1, n + 1)  # [B, n + 1]
    out = step_result(emitted, extra, meta.eos_ids, active, broken_logits(logits, used))
    ranks = torch.where(on_path, plan.ranks[path.clamp(min=0)], -1)  # [B, K]
    return torch.cat([out, ranks.T])


def path_contexts(path: torch.Tensor) -> torch.Tensor:
    """[B, K + 1]: for the token at each depth of an accepted path (``path`` [B, K], -1 past it) and
    the one after it, the verifier's column whose logits it was drawn or accepted at: the root (0),
    then the path's nodes (node j's column is j + 1)."""
    return torch.cat([torch.zeros_like(path[:, :1]), path + 1], 1).clamp(min=0)


def keep_tree_emitted(
    state: DecodeState,
    tree_start: torch.Tensor,  # [B]
    path: torch.Tensor,  # [B, K] accepted nodes, -1 past the path
    emitted: torch.Tensor,  # [B] accepted drafts as the ledger counts them; the extra token follows
    active: torch.Tensor,  # [B] bool
    logits: torch.Tensor,  # [B, n + 1, V] the verifier's processed logits at every context
    lse: torch.Tensor,  # [B, n + 1] fp32
) -> None:
    """Keep the verifier's own p for every token it emitted at positions ``P .. P + emitted``: the
    distribution at the context each token was drawn or accepted at (the root, then the path's
    nodes), or a point mass on the token where that is broken (``point_masses_where_broken``). Never
    the residual a correction was drawn from (docs/design.md, "Verify")."""
    rows = torch.arange(len(tree_start), device=tree_start.device)[:, None]  # [B, 1]
    columns = torch.arange(path.shape[1] + 1, device=path.device)  # [K + 1]
    contexts = path_contexts(path)  # [B, K + 1]
    kept = active[:, None] & (columns <= emitted[:, None])  # [B, K + 1]
    slots = state.ring_slot(tree_start[:, None] + columns, kept)  # [B, K + 1]
    tokens = state.tokens[rows, torch.where(kept, tree_start[:, None] + columns, state.trash)]  # [B, K + 1]
    state.keep_p(rows, slots, *point_masses_where_broken(logits[rows, contexts], lse[rows, contexts], tokens))
