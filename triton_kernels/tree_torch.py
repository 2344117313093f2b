"""Token trees at the bottom level: drafting a node's children and verifying a tree, torch references
(docs/design.md, "Token trees"). They import no Triton.

Terms (``hsd_fast.tree`` defines the topology: parents, depths, columns, ranks):

    context c   what a level's logits at c predict is a child of c: c = 0 is the root (the last token
                before the tree), c = j + 1 is node j. Tensors over contexts have n + 1 entries.
    position    the absolute position of a node's token: P + depth, with P (``positions``) the
                position of the tree's first depth
    key         siblings share a position, so a node's randomness is keyed by its position with its
                column folded in: ``position | column << 24`` (positions < 2**24). A context's key is
                the key its children are drawn under and its correction or bonus is drawn under:
                the root's is (P, column 0), node j's (P + depth_j + 1, column_j). With column 0
                everywhere a chain's keys are the ordinary positions, so ``Tree.chain(n)`` draws and
                verifies exactly the tokens of a block of n drafts.

Drafting (``draft_children_torch``): a context's k children are k distinct tokens: greedy, the
top-k of the processed logits; sampling, Gumbel-top-k under the context's key with purpose DRAFT,
which draws k tokens from q without replacement, the first of them the token a single draw (the
race of ``sample_torch``) would give.

Verification (``verify_tree_torch``, recursive rejection sampling without replacement): at a context
with verifier distribution p and draft distribution q, try its children in rank order; accept child
x with probability min(1, p(x) / q(x)) (its own key, purpose ACCEPT). After rejecting x, set
p <- normalize(max(0, p - q)) with the current q (if that has no mass, p and q were equal up to
rounding: keep p), then q(x) := 0 and renormalise q by what is left. A child whose current q is 0
(more children than q's support) is never accepted and changes nothing. On acceptance, descend into
x with the verifier's and the draft's distributions at x. When no child is accepted, the correction
is drawn from the current p (purpose RESIDUAL if a child was rejected there, else BONUS); after an
accepted leaf, the bonus from p at the leaf. Each draw of a context uses that context's key. An
accepted node that ``stops`` (an EOS) ends the path; its bonus is drawn, and the ledger drops it.
Nodes at depth ``>= max_depth`` (past the row's length budget) are never accepted. Greedy: descend
into the child equal to the verifier's argmax, else correct with the argmax.

Why it is exact: drawing the children of a context one after the other without replacement from q
and testing them in that order with the updated p and q is, step by step, speculative sampling with
draft q against target p, then with the draft "q without the tokens already tried" against the
residual; each step leaves the emitted token distributed as the p it started from (Sequoia,
arXiv 2402.12374, Theorem 3.3).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from .keyed_random_torch import ACCEPT, BONUS, DRAFT, RESIDUAL, race_torch, uniform_grid_torch, uniform_torch
from .rejection_torch import RESIDUAL_EPS

COLUMN_SHIFT = 24
"""A key's position field holds ``position | column << COLUMN_SHIFT``."""


def node_key(positions: torch.Tensor, columns: torch.Tensor | int) -> torch.Tensor:
    """The key position of a token at absolute ``positions`` in tree column ``columns`` (int64)."""
    # Checked eagerly; a compiled step cannot raise on data (its caller checks the run's positions).
    out_of_range = (positions >= 1 << COLUMN_SHIFT) | (positions < 0)
    if not torch.compiler.is_compiling() and bool(out_of_range.any()):
        raise ValueError(f"tree positions must lie in [0, 2**{COLUMN_SHIFT}) to leave room for the column")
    return positions | (torch.as_tensor(columns, device=positions.device) << COLUMN_SHIFT)


def draft_children_torch(
    logits: torch.Tensor,  # [R, V] processed logits of one context per row; -inf marks excluded tokens
    num_children: int,
    temperature: torch.Tensor,  # [R] fp32
    seeds: torch.Tensor,  # [R] int64
    keys: torch.Tensor,  # [R] int64 the context's key (node_key)
    level: int,
    greedy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # children [R, k] int64 in rank order, log-sum-exp [R] fp32
    """A context's ``num_children`` distinct children (module doc), and the fp32 log-sum-exp of
    ``logits / temperature`` (q, for the verifier)."""
    vocab = logits.shape[-1]
    if not 1 <= num_children <= vocab:
        raise ValueError(f"num_children must lie in [1, {vocab}] (the vocabulary), got {num_children}")
    scaled = logits.float() / temperature[:, None]  # [R, V]
    lse = torch.logsumexp(scaled, dim=-1)  # [R]
    if greedy:
        return torch.topk(logits.float(), num_children, dim=-1).indices, lse
    gumbel = -torch.log(-torch.log(uniform_grid_torch(seeds, level, keys, DRAFT, vocab)))  # [R, V]
    return torch.topk(scaled + gumbel, num_children, dim=-1).indices, lse


class Topology(Protocol):
    """What the references read of a tree (``hsd_fast.tree.Tree`` has it; ops import no engine)."""

    parents: tuple[int, ...]
    depths: tuple[int, ...]
    columns: tuple[int, ...]
    children: tuple[tuple[int, ...], ...]  # [n + 1]: node j's at j, the root's last


class TreeVerifyResult(NamedTuple):
    path: torch.Tensor  # [B, depth] int64: the accepted nodes, root first; -1 after the path's end
    num_accepted: torch.Tensor  # [B] int64: the path's length
    next_token: torch.Tensor  # [B] int64: the correction (no child accepted) or the bonus
    verifier_lse: torch.Tensor  # [B, n + 1] fp32 log-sum-exp of verifier_logits / temperature


def children_table(tree: Topology) -> torch.Tensor:
    """[n + 1, K] int64: context c's children in rank order (c = 0: the root's), -1 padded."""
    by_context = [tree.children[-1], *tree.children[:-1]]
    width = max(len(c) for c in by_context)
    return torch.tensor([[*c, *[-1] * (width - len(c))] for c in by_context], dtype=torch.int64)


def verify_tree_torch(
    verifier_logits: torch.Tensor,  # [B, n + 1, V] processed, at every context
    draft_logits: torch.Tensor | None,  # [B, n + 1, V] level 0's, processed (leaves' unused); None: greedy
    tokens: torch.Tensor,  # [B, n] int64 the nodes' tokens
    tree: Topology,
    temperature: torch.Tensor,  # [B] fp32
    seeds: torch.Tensor,  # [B] int64
    positions: torch.Tensor,  # [B] int64 absolute position of the tree's first depth
    level: int,
    greedy: bool,
    max_depth: torch.Tensor | None = None,  # [B] int64: nodes this deep or deeper are never accepted
    stops: torch.Tensor | None = None,  # [B, n] bool: an accepted node here ends the path (an EOS)
) -> TreeVerifyResult:
    """Recursive rejection sampling without replacement over one tree per row (module doc)."""
    num_rows, num_contexts, vocab = verifier_logits.shape
    device = verifier_logits.device
    n = num_contexts - 1
    if len(tree.parents) != n or tokens.shape != (num_rows, n):
        raise ValueError(
            f"a tree of {len(tree.parents)} nodes needs tokens [B, n] and logits for n + 1 contexts; got "
            f"tokens {tuple(tokens.shape)} and {num_contexts} contexts"
        )
    if not greedy and draft_logits is None:
        raise ValueError("sampling needs the draft's logits")
    rows = torch.arange(num_rows, device=device)
    depth_of = torch.tensor(tree.depths, device=device)  # [n]
    column_of = torch.tensor(tree.columns, device=device)  # [n]
    kids = children_table(tree).to(device)  # [n + 1, K]
    is_leaf = (kids[1:] < 0).all(-1)  # [n]
    # Keys: node j's own (its accept test), and each context's (its children, its correction or bonus).
    node_keys = node_key(positions[:, None] + depth_of, column_of)  # [B, n]
    root_key = node_key(positions, 0)[:, None]  # [B, 1]
    context_keys = torch.cat(
        [root_key, node_key(positions[:, None] + depth_of + 1, column_of)], 1
    )  # [B, n + 1]
    max_depth = torch.full_like(positions, n + 1) if max_depth is None else max_depth
    stops = torch.zeros_like(tokens, dtype=torch.bool) if stops is None else stops

    scaled = verifier_logits.float() / temperature[:, None, None]  # [B, n + 1, V]
    verifier_lse = torch.logsumexp(scaled, dim=-1)  # [B, n + 1]
    logp_all = scaled - verifier_lse[..., None]  # [B, n + 1, V]
    if not greedy:
        draft_scaled = draft_logits.float() / temperature[:, None, None]
        logq_all = draft_scaled - torch.logsumexp(draft_scaled, dim=-1, keepdim=True)  # [B, n + 1, V]

    context = torch.zeros(num_rows, dtype=torch.int64, device=device)  # [B] where each row stands
    done = torch.zeros(num_rows, dtype=torch.bool, device=device)  # [B] the path has ended
    residual_draw = torch.zeros_like(done)  # [B] the path ended at a context where a child was rejected
    path = torch.full((num_rows, max(tree.depths) + 1), -1, dtype=torch.int64, device=device)
    num_accepted = torch.zeros(num_rows, dtype=torch.int64, device=device)
    log_weights = logp_all[:, 0]  # [B, V] what a row's correction or bonus is drawn from
    for d in range(path.shape[1]):
        logp = logp_all[rows, context]  # [B, V] the verifier's p at the current context
        touched = torch.zeros_like(done)  # p or q changed by a rejected sibling
        if greedy:
            best = torch.argmax(verifier_logits[rows, context], dim=-1)  # [B] the child to descend into
        else:
            p_weights, p_mass = logp.exp(), torch.ones(num_rows, device=device)  # p = p_weights / p_mass
            logq = logq_all[rows, context]  # [B, V]
            q = logq.exp()
        rejected_here = torch.zeros_like(done)
        chosen = torch.full_like(context, -1)  # [B] the accepted child
        for rank in range(kids.shape[1]):
            child = kids[context, rank]  # [B], -1 where the context has fewer children
            trying = ~done & (chosen < 0) & (child >= 0) & (d < max_depth)
            at = child.clamp(min=0)
            x = tokens[rows, at].clamp(0, vocab - 1)[:, None]  # [B, 1]
            if greedy:
                chosen = torch.where(trying & (tokens[rows, at] == best), child, chosen)
                continue
            qx = q.gather(-1, x)[:, 0]  # [B]
            # log p(x) / q(x); untouched, exactly as verify_torch computes it (a chain then matches it)
            untouched_ratio = logp.gather(-1, x)[:, 0] - logq.gather(-1, x)[:, 0]  # [B]
            touched_ratio = (p_weights.gather(-1, x)[:, 0] / p_mass).log() - qx.log()  # [B]
            ratio = torch.where(touched, touched_ratio, untouched_ratio)
            u = accept_uniform(seeds, level, node_keys[rows, at])
            ok = (qx > 0) & (torch.log(u) <= ratio)
            chosen = torch.where(trying & ok, child, chosen)
            reject = trying & ~ok & (qx > 0)  # [B] a child with q(x) = 0 changes nothing
            p_weights, p_mass, q = after_rejection(p_weights, p_mass, q, x, logp, reject)
            touched = touched | reject
            rejected_here = rejected_here | reject
        # Rows that accepted no child end here: their correction (or bonus) comes from the current p.
        ends_here = ~done & (chosen < 0)
        residual_draw = torch.where(ends_here, rejected_here, residual_draw)
        if not greedy:
            current_p = torch.where(touched[:, None], p_weights.log(), logp)  # [B, V] up to a constant
            log_weights = torch.where(ends_here[:, None], current_p, log_weights)
        done = done | ends_here
        going = ~done
        path[:, d] = torch.where(going, chosen, -1)
        num_accepted = num_accepted + going.long()
        context = torch.where(going, chosen + 1, context)
        node = chosen.clamp(min=0)
        finished = going & (is_leaf[node] | stops[rows, node])  # the bonus follows an accepted leaf
        log_weights = torch.where(finished[:, None], logp_all[rows, context], log_weights)
        done = done | finished
        if not torch.compiler.is_compiling() and bool(done.all()):  # eager: stop early; compiled: static
            break
    keys = context_keys[rows, context]  # [B] the key of the context the path ended at
    if greedy:
        next_token = torch.argmax(verifier_logits[rows, context], dim=-1)
    else:
        purpose = torch.where(residual_draw, RESIDUAL, BONUS)
        next_token = race_torch(log_weights, seeds, level, keys, purpose)
    return TreeVerifyResult(path, num_accepted, next_token, verifier_lse)


def accept_uniform(
    seeds: torch.Tensor,  # [B]
    level: int,
    child_keys: torch.Tensor,  # [B] the key of the child being tested
) -> torch.Tensor:
    """[B] the uniform of a child's accept test: keyed by the child itself, so siblings never share
    one (a shared uniform couples their tests and biases the output)."""
    return uniform_torch(seeds, level, child_keys, ACCEPT)


def after_rejection(
    p_weights: torch.Tensor,  # [B, V] p up to its mass
    p_mass: torch.Tensor,  # [B]
    q: torch.Tensor,  # [B, V] normalised
    x: torch.Tensor,  # [B, 1] the rejected child's token
    logp: torch.Tensor,  # [B, V] the verifier's own log p at this context (the epsilon guard's fallback)
    reject: torch.Tensor,  # [B] bool: rows that rejected x
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """p <- max(0, p - q) (kept unnormalised, its mass apart; p itself if that has no mass), then
    q(x) := 0 renormalised, for the rows that rejected x."""
    residual = (p_weights / p_mass[:, None] - q).clamp_min(0.0)  # [B, V]
    mass = residual.sum(-1)  # [B]
    use_residual = reject & (mass >= RESIDUAL_EPS)
    fallback = reject & ~use_residual  # p and q equal up to rounding: draw from the verifier's p
    p_weights = torch.where(fallback[:, None], logp.exp(), p_weights)
    p_weights = torch.where(use_residual[:, None], residual, p_weights)
    p_mass = torch.where(use_residual, mass, torch.where(fallback, 1.0, p_mass))
    removed = q.scatter(-1, x, 0.0)  # [B, V]
    left = removed.sum(-1, keepdim=True)  # [B, 1]
    removed = torch.where(left > 0, removed / left.clamp_min(torch.finfo(q.dtype).tiny), removed)
    return p_weights, p_mass, torch.where(reject[:, None], removed, q)
