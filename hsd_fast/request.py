"""One request: what ``hsd_fast.generate`` (and ``hsd_fast.wrap``) were given, checked once and frozen.

The HF glue (``hf_generate``, ``wrapper``) hands over its arguments as they came; this module turns
them into a ``Request`` holding exactly what ``engine.run_hsd`` takes, or raises the error that names
what is wrong, before anything is allocated. Two steps:

- ``resolve_levels``: the levels under the target (``drafts`` with an optional lookup level first,
  ``T``, ``tree``, or a ``Hierarchy`` from ``select_hierarchy``). The wrapper resolves them once,
  when it is made, and passes the result on; ``generate`` resolves what it was given.
- ``build_request``: the prompt, the models, the generation config (sampling, stopping, limits),
  the seed and the streamer, checked in this order: levels, input_ids, models and devices, options
  HSD cannot honour (``generation_options.OPTIONS``: every ``GenerationConfig`` field served, refused
  or without effect), the stopping criteria (stop strings included), the prompt's padding and ids,
  the positions, the logits processors, the streamer's batch.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.stopping_criteria import (
    ConfidenceCriteria,
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxTimeCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)

from hsd_fast.attached import attached
from hsd_fast.compat import check_devices, check_model, hierarchy_vocab_size
from hsd_fast.controller import LatencyController
from hsd_fast.early_exit import EarlyExit, check_exit_order, exit_of, recomputing_variant
from hsd_fast.engine import MAX_BLOCK_SIZE, check_block_sizes
from hsd_fast.generation_options import check_generation_options
from hsd_fast.hierarchy_types import DEFAULT_MAX_T, Hierarchy
from hsd_fast.lookup import LookupDraft, as_lookup, level_identity
from hsd_fast.other_tokenizer import OtherTokenizerDraft, same_tokenizer
from hsd_fast.positions import check_positions, max_positions
from hsd_fast.processors import LogitsTransform
from hsd_fast.proposal_level import ProposalLevel
from hsd_fast.switching_types import Adaptive, Choice, Policy
from hsd_fast.target_outputs import NO_OUTPUTS, OutputRequest
from hsd_fast.tree import Tree

DEFAULT_T = 4
"""The block size of every level whose ``T`` is not given."""

REFUSED_STOPPING = (ConfidenceCriteria,)
"""Stopping criteria hsd_fast refuses: an assistant's confidence stop reads the scores, which HF's
loop and hsd_fast pass as None unless ``output_scores``. Every other criterion is served."""


@dataclass(frozen=True)
class Levels:
    """The levels under the target: a proposal level (a lookup level or a draft with another
    tokenizer; or None), the draft models smallest first, one block size per level (the proposal
    level's first), the token tree the first draft drafts, and the
    ``Hierarchy`` they came from (None when given as drafts/T/tree). An adaptive request's levels are
    the candidates (``adapt``), with no block sizes or tree of their own."""

    proposal: ProposalLevel | None
    models: tuple[torch.nn.Module, ...]
    T: tuple[int, ...]
    tree: Tree | None = None
    hierarchy: Hierarchy | None = None
    adapt: Adaptive | None = None  # the levels are candidates: a policy chooses per round among them
    default_T: bool = False  # T was not given: every block size is DEFAULT_T

    @property
    def drafts(self) -> list[torch.nn.Module | ProposalLevel]:
        """Every level under the target, smallest first (``"lookup"`` as its ``LookupDraft``)."""
        return [*([] if self.proposal is None else [self.proposal]), *self.models]


@dataclass(frozen=True, eq=False)
class Request:
    """A checked request: the engine's arguments, and what the HF glue needs to build HF's output."""

    target: torch.nn.Module
    levels: Levels
    input_ids: torch.Tensor  # [B, L] as given (left padded): the output continues it
    prompts: tuple[torch.Tensor, ...]  # each row without its left padding
    vocab: int  # every level samples over the target's logits
    max_new_tokens: int
    eos_ids: tuple[int, ...]
    pad_id: int  # fills a row that stopped before the longest
    seed: int | Sequence[int] | torch.Tensor  # drawn from torch's generator when not given
    transform: LogitsTransform  # the sampling transform (HF's logits processors), temperature included
    greedy: bool
    compile: bool | str
    streamer: Any | None  # put the committed tokens; None: no streaming
    return_dict: bool  # HF's return_dict_in_generate
    # HF's stopping criteria, called as its loop calls them (stopping.StopChecker); None when they are
    # only the length budget and EOS, which the ledger applies itself
    stopping: StoppingCriteriaList | None = None
    pads_finished: bool = True  # a stopped row's later tokens are pad_id (HF: with an EOS criterion)
    outputs: OutputRequest = NO_OUTPUTS  # the target's scores / logits per new token (HF's output_*)


def resolve_levels(
    drafts: Sequence[torch.nn.Module | LookupDraft | str] = (),
    T: Sequence[int] | None = None,
    tree: Tree | None = None,
    hierarchy: Hierarchy | None = None,
    adapt: bool | Policy | Adaptive = False,
    trees: Sequence[Tree] = (),
    assistant_model: torch.nn.Module | None = None,
    draft_tokenizers: Sequence[Any] | None = None,
    target_tokenizer: Any = None,
) -> Levels:
    """``drafts``/``T``/``tree``, or ``hierarchy`` (not both), as ``Levels``; a TypeError or
    ValueError naming the argument otherwise. ``T`` defaults to ``DEFAULT_T`` at every level.
    ``assistant_model`` (HF's assisted generation): the one draft, ``drafts=[assistant_model]``.
    ``adapt`` (True, a policy, or an ``Adaptive``): ``drafts`` are candidates, ``trees`` the token
    trees a round may draft, and ``hierarchy`` (if given) the first round's hierarchy.
    ``draft_tokenizers`` (one per draft, None: the tokenizer of the level above) with
    ``target_tokenizer``: the draft with another tokenizer than the level above becomes an
    ``OtherTokenizerDraft``, the drafts below it (in its tokenizer) its ``below`` (``bridged_drafts``)."""
    if assistant_model is not None:
        if drafts or hierarchy is not None:
            raise ValueError("assistant_model= is the one draft: give it in drafts= (last) instead")
        drafts = [assistant_model]
    if draft_tokenizers is not None:
        if adapt is not False or hierarchy is not None:
            raise ValueError("draft_tokenizers= goes with drafts=; adapt= and hierarchy= do not take it yet")
        drafts, T = bridged_drafts(drafts, draft_tokenizers, target_tokenizer, T)
    if adapt is not False:
        return _adaptive_levels(drafts, T, tree, hierarchy, adapt, trees)
    if trees:
        raise ValueError(
            "trees= offers token trees to an adaptive run (adapt=True); a fixed hierarchy takes tree="
        )
    if hierarchy is not None:  # from hsd_fast.select_hierarchy: its drafts and block sizes
        _check_hierarchy(hierarchy)
        if drafts or T is not None or tree is not None:
            raise ValueError("pass either hierarchy= or drafts=/T=/tree=, not both")
        drafts, T, tree = hierarchy.drafts, hierarchy.T, hierarchy.tree
    proposal, models = check_drafts(drafts)
    if hierarchy is None:
        warn_unless_smallest_first(models, first=len(drafts) - len(models))
    num_drafts = len(models) + (proposal is not None)  # a proposal level sits below the draft models
    # With a tree, T[0] is checked like any block size and then stands for the tree's depth
    default_T = T is None and hierarchy is None
    T = check_block_sizes([DEFAULT_T] * num_drafts if T is None else T, num_drafts, "T")
    check_tree(tree, proposal, models)
    return Levels(proposal, tuple(models), tuple(T), tree, hierarchy, default_T=default_T)


HF_NUM_ASSISTANT_TOKENS = 20
"""HF's default ``num_assistant_tokens`` (every ``GenerationConfig`` carries it): it leaves T alone."""


def with_assisted_generation(levels: Levels, target: torch.nn.Module, config) -> Levels:
    """HF's assisted-generation options as hsd_fast's levels (docs/design.md, "HF's assisted
    generation options"): ``assistant_early_exit=k`` adds ``EarlyExit(target, k)`` just under the
    target; ``num_assistant_tokens=k`` (other than HF's default 20) is the block size of the level
    just under the target (with ``T=`` given, it must agree); ``prompt_lookup_num_tokens=k`` adds the
    lookup level at the bottom, with block size k and ``max_matching_ngram_size`` (HF's default 2)
    its longest n-gram."""
    with_exit = _with_assistant_early_exit(levels, target, config)
    last_given = not levels.default_T and len(with_exit.drafts) == len(levels.drafts)  # T[-1] the user's
    levels = with_exit
    tokens = getattr(config, "num_assistant_tokens", None)
    if tokens is not None and tokens != HF_NUM_ASSISTANT_TOKENS and levels.drafts:  # no draft: no effect
        _no_choice_made_for_it("num_assistant_tokens", levels)
        if last_given and levels.T[-1] != tokens:
            raise ValueError(
                f"num_assistant_tokens={tokens} and T={list(levels.T)}: the level under the target drafts "
                f"T[-1]={levels.T[-1]} tokens; give one of them"
            )
        levels = replace(
            levels, T=(*levels.T[:-1], check_block_sizes([tokens], 1, "num_assistant_tokens")[0])
        )
    lookup_tokens = getattr(config, "prompt_lookup_num_tokens", None)
    if lookup_tokens is None:
        return levels
    _no_choice_made_for_it("prompt_lookup_num_tokens", levels)
    if isinstance(levels.proposal, LookupDraft):
        raise ValueError(
            "prompt_lookup_num_tokens adds a lookup level, and drafts= has one: set its block size in T= only"
        )
    if levels.proposal is not None:
        raise ValueError(
            f"prompt_lookup_num_tokens adds a lookup level under drafts[0], a "
            f"{type(levels.proposal).__name__}, which can only be the first level"
        )
    if levels.tree is not None:
        raise ValueError("prompt_lookup_num_tokens with tree=: the lookup level drafts chains, not trees")
    ngram = getattr(config, "max_matching_ngram_size", None) or HF_MAX_MATCHING_NGRAM
    T = check_block_sizes([lookup_tokens], 1, "prompt_lookup_num_tokens")
    try:
        lookup = LookupDraft(max_ngram=ngram)
    except (TypeError, ValueError) as err:
        raise type(err)(f"max_matching_ngram_size={ngram!r}: {err}") from None
    return replace(levels, proposal=lookup, T=(*T, *levels.T))


HF_MAX_MATCHING_NGRAM = 2
"""HF's prompt lookup matches suffixes of at most this many tokens unless ``max_matching_ngram_size``."""


def _no_choice_made_for_it(option: str, levels: Levels) -> None:
    """An assisted-generation option cannot change a selected hierarchy or an adaptive one's choices."""
    if levels.adapt is not None:
        raise ValueError(f"{option} with adapt=: the policy chooses the levels and block sizes every round")
    if levels.hierarchy is not None:
        raise ValueError(f"{option} with hierarchy=: give the levels and block sizes to select_hierarchy")


def _with_assistant_early_exit(levels: Levels, target: torch.nn.Module, config) -> Levels:
    """HF's ``assistant_early_exit=k`` (its self-speculation) as hsd_fast's level: without drafts,
    the hierarchy ``[EarlyExit(target, k)]``; with drafts (or adaptive candidates), the exit added
    just under the target, with the default block size (docs/design.md, "Early-exit levels")."""
    k = getattr(config, "assistant_early_exit", None)
    if k is None:
        return levels
    exit_level = EarlyExit(target, k)  # a ValueError names a bad k
    if any(m is exit_level for m in levels.models):
        return levels
    if levels.hierarchy is not None and levels.adapt is None:
        raise ValueError(
            "assistant_early_exit with hierarchy=: give hsd_fast.EarlyExit(target, k) to select_hierarchy's "
            "candidates instead"
        )
    models = (*levels.models, exit_level)
    check_exit_order(models)
    T = levels.T if levels.adapt is not None else (*levels.T, DEFAULT_T)
    return replace(levels, models=models, T=T)


def _check_hierarchy(hierarchy: object) -> None:
    if not isinstance(hierarchy, Hierarchy):
        raise TypeError(
            f"hierarchy must be a Hierarchy (from select_hierarchy), got {type(hierarchy).__name__}"
        )


def _adaptive_levels(drafts, T, tree, hierarchy, adapt, trees) -> Levels:
    """The candidates of an adaptive request, its policy, trees and first hierarchy, checked."""
    if T is not None:
        raise ValueError(
            "adapt: the policy chooses the block sizes every round (a Choice's T); do not pass T="
        )
    if tree is not None:
        raise ValueError("adapt: offer token trees with trees=[...]; the policy chooses when to draft one")
    if isinstance(adapt, Adaptive):
        if trees:
            raise ValueError("adapt: give the trees in the Adaptive (its trees=), not also as trees=")
        spec = adapt
    elif adapt is True:
        spec = Adaptive(None)  # the built-in policy, fresh for every run
    elif callable(adapt):  # a policy that says how deep it chooses (``max_T``) gets a ring that deep
        spec = Adaptive(adapt, max_T=getattr(adapt, "max_T", DEFAULT_MAX_T))
    else:
        raise TypeError(f"adapt must be True, False, a policy (a callable) or an Adaptive, got {adapt!r}")
    spec = replace(spec, trees=tuple(spec.trees) + tuple(trees))
    own_candidates = bool(drafts)  # not a pick's (ordered by cost)
    if hierarchy is not None:
        _check_hierarchy(hierarchy)
        if adapt is True and hierarchy.profile is not None:
            # the latency model steers (below), up to the block size the selection chose from
            spec = replace(spec, max_T=hierarchy.profile.max_T)
        drafts = drafts or hierarchy.drafts
        if hierarchy.tree is not None and hierarchy.tree not in spec.trees:
            spec = replace(spec, trees=(*spec.trees, hierarchy.tree))
    lookup, models = check_drafts(drafts)
    if own_candidates:
        warn_unless_smallest_first(models, first=len(drafts) - len(models))
    if lookup is not None and not isinstance(lookup, LookupDraft):
        raise ValueError(f"adapt: the candidates can hold a lookup level, not a {type(lookup).__name__}")
    candidates = [*([] if lookup is None else [lookup]), *models]
    if len({id(m) for m in models}) < len(models):
        raise ValueError("adapt: each candidate may appear once in drafts")
    for t in spec.trees:
        check_tree(t, None, models)
        if t.depth > spec.max_T:
            raise ValueError(f"adapt: a tree {t.depth} deep is deeper than max_T={spec.max_T}")
    if hierarchy is not None:
        if adapt is True and hierarchy.profile is not None:  # the latency model steers, from its profile
            spec = replace(spec, policy=LatencyController.kept_for(hierarchy, candidates, max_T=spec.max_T))
        spec = replace(spec, start=_start_of(hierarchy, candidates, spec))
        if isinstance(spec.policy, LatencyController) and spec.policy.current is not None:
            spec = replace(spec, start=None)  # it served earlier requests: it starts where they left it
    return Levels(lookup, tuple(models), (), None, hierarchy, spec)


def _start_of(hierarchy: Hierarchy, candidates: list, spec: Adaptive) -> Choice:
    """``hierarchy`` as a ``Choice`` over ``candidates`` (the first round's hierarchy). An early exit
    of the hierarchy's is the candidate that is the same exit reusing or not (the selector may have
    picked its recomputing twin; an adaptive run recomputes either way)."""
    index = {level_identity(c): i for i, c in enumerate(candidates)}
    for i, c in enumerate(candidates):
        if (twin := recomputing_variant(c)) is not None:
            index.setdefault(level_identity(twin), i)
    keys = [level_identity(d) for d in hierarchy.drafts]
    missing = [i for i, k in enumerate(keys) if k not in index]
    if missing:
        raise ValueError(
            f"adapt: hierarchy= drafts {missing} (by position) are not among the candidates in drafts="
        )
    if any(t > spec.max_T for t in hierarchy.T):
        raise ValueError(f"adapt: hierarchy= has T={list(hierarchy.T)}, above max_T={spec.max_T}")
    tree = hierarchy.tree
    if tree is not None and tree not in spec.trees:
        spec_trees = (*spec.trees, tree)
        raise ValueError(
            f"adapt: hierarchy= drafts a token tree; offer it in trees= too ({len(spec_trees)} trees)"
        )
    return Choice(tuple(index[k] for k in keys), tuple(hierarchy.T), tree)


def check_tree(tree: Tree | None, proposal: ProposalLevel | None, models: Sequence[torch.nn.Module]) -> None:
    """A token tree the first draft model can draft: a ``Tree``, drafted by a model (not under a
    proposal level), at most ``MAX_BLOCK_SIZE`` deep (its depth is level 0's block)."""
    if tree is None:
        return
    if not isinstance(tree, Tree):
        raise TypeError(
            f"tree must be a hsd_fast.Tree (Tree.chain, full, spine, ...), got {type(tree).__name__}"
        )
    if proposal is not None or not models:  # an adaptive run passes no lookup: its trees skip it
        raise ValueError("tree: a token tree is drafted by a model at level 0: give at least one draft model")
    if tree.depth > MAX_BLOCK_SIZE:
        raise ValueError(f"tree: a token tree may be at most {MAX_BLOCK_SIZE} deep, got {tree.depth}")


def check_compile(compile: object) -> None:
    """``compile``: True, False or ``"auto"`` (``hsd_fast.generate``)."""
    if not (isinstance(compile, bool) or (isinstance(compile, str) and compile == "auto")):
        raise ValueError(f"compile must be True, False or 'auto', got {compile!r}")


def build_request(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    levels: Levels,
    *,
    generation_config,
    logits_processor=None,
    stopping_criteria=None,
    seed: int | Sequence[int] | torch.Tensor | None = None,
    compile: bool | str = "auto",
    streamer=None,
    model_kwargs: dict | None = None,
    stop_strings: str | Sequence[str] | None = None,
    stop_tokenizer=None,
) -> Request:
    """The request ``model.generate(input_ids, ...)`` makes of HSD with ``levels`` under ``model``,
    checked; ``generation_config``, ``logits_processor``, ``stopping_criteria`` as HF prepared them
    (on a direct call, a config filled and the processors and criteria built as HF would).
    A ``HierarchyBatchWarning`` when ``levels`` came from a hierarchy selected for another batch.
    ``stop_strings``: hsd_fast's own keyword (HF drops ``tokenizer=`` before a ``custom_generate``
    callable, docs/design.md, "Stop strings and the tokenizer"), served with HF's
    ``StopStringCriteria`` over ``stop_tokenizer``."""
    model_kwargs = model_kwargs or {}
    check_input_ids(input_ids, model_kwargs)
    # HF's generate passes the processors and criteria it prepared with the config it filled: used as
    # they are (refilling a prepared config would undo the user's explicit None, e.g. top_k=None)
    direct = logits_processor is None or stopping_criteria is None
    if direct:
        generation_config, model_kwargs = _generation_keywords(generation_config, model_kwargs)
    config = filled_config(model, generation_config, input_ids.shape[1]) if direct else generation_config
    if levels.hierarchy is not None:
        levels.hierarchy.warn_unless_selected_for(input_ids.shape[0])
    levels = with_assisted_generation(levels, model, config)
    drafts = levels.models
    _check_models_and_options(model, drafts, input_ids, config)
    if direct and config.stop_strings is not None and stop_tokenizer is None:
        _no_tokenizer()
    logits_processor, stopping_criteria = _hf_prepared(
        model, input_ids, config, logits_processor, stopping_criteria, model_kwargs, stop_tokenizer
    )
    stopping_criteria = _with_stop_strings(stopping_criteria, stop_strings, stop_tokenizer)
    eos_ids = _eos_ids(config)
    stopping = _extra_stopping(stopping_criteria, config, eos_ids)
    vocab = hierarchy_vocab_size(model, drafts)
    if levels.tree is not None and levels.tree.most_children > vocab:
        raise ValueError(
            f"tree: a node has {levels.tree.most_children} children, more than the {vocab} tokens of the "
            "vocabulary (siblings are distinct tokens)"
        )
    check_compile(compile)
    prompts = _prompts(input_ids, model_kwargs.get("attention_mask"), vocab)
    max_new_tokens = config.max_length - input_ids.shape[1]
    levels_by_role = [*((f"draft {i}", d) for i, d in enumerate(drafts)), ("target", model)]
    check_positions(
        max(p.numel() for p in prompts) + max_new_tokens,
        [(f"{role} ({type(m).__name__})", max_positions(m.config)) for role, m in levels_by_role],
        asked="prompt + max_new_tokens",
        remedy="lower max_new_tokens",
    )
    # the padded prompt: a history processor (repetition penalty) counts the pads HF's would
    transform = LogitsTransform(
        list(logits_processor), input_ids=input_ids, attention_mask=model_kwargs.get("attention_mask")
    )
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())  # host value by design: keys the hash
    if streamer is not None and input_ids.shape[0] > 1:
        raise ValueError("a streamer only supports batch size 1 (as in HF)")
    return Request(
        target=model,
        levels=levels,
        input_ids=input_ids,
        prompts=tuple(prompts),
        vocab=vocab,
        max_new_tokens=max_new_tokens,
        eos_ids=tuple(eos_ids),
        pad_id=_pad_id(config, eos_ids),
        seed=seed,
        transform=transform,
        greedy=not config.do_sample,
        compile=compile,
        streamer=streamer,
        return_dict=bool(config.return_dict_in_generate),
        outputs=OutputRequest(  # HF returns them only in a dict
            scores=bool(config.output_scores and config.return_dict_in_generate),
            logits=bool(config.output_logits and config.return_dict_in_generate),
        ),
        stopping=stopping,
        pads_finished=stopping is not None and any(hasattr(c, "eos_token_id") for c in stopping),
    )


def _generation_keywords(config: GenerationConfig | None, model_kwargs: dict) -> tuple:
    """A direct call's generation options given as keywords (``max_new_tokens=16``,
    ``repetition_penalty=1.3``) moved into a copy of its config, overriding it, as HF's ``generate``
    moves them; the other keywords stay model inputs. The caller's config is never changed."""
    probe = GenerationConfig()
    if not any(hasattr(probe, k) for k in model_kwargs):
        return config, model_kwargs
    config = copy.deepcopy(config) if config is not None else GenerationConfig()
    return config, config.update(**model_kwargs)


def filled_config(
    model: torch.nn.Module, config: GenerationConfig | None, prompt_length: int
) -> GenerationConfig:
    """``config`` (or a bare ``GenerationConfig``) filled as HF's ``generate`` fills it before it calls
    a ``custom_generate`` callable, so that a direct ``hsd_fast.generate(model, ids, generation_config=
    ...)`` decodes as ``model.generate`` would: unset fields from ``model.generation_config``, then HF's
    global defaults; ``max_length`` from ``max_new_tokens`` (which takes precedence), else HF's
    default of 20 new tokens within ``max_position_embeddings``. A config HF prepared is returned
    as it is; the caller's is never changed."""
    defaults = getattr(GenerationConfig, "_get_default_generation_params", dict)()  # 5.24; 5.17: none
    if config is not None and not _unfilled(config, defaults, prompt_length):  # as HF prepared it
        return config
    config = copy.copy(config) if config is not None else GenerationConfig()  # fields set, never mutated
    model_config = getattr(model, "generation_config", None) or GenerationConfig()
    default_max_length = config.max_length is None and model_config.max_length is None
    for source in (model_config.to_dict(), defaults):
        for name, value in source.items():
            if getattr(config, name, None) is None and value is not None:
                setattr(config, name, copy.deepcopy(value))
    if config.max_new_tokens is not None:
        config.max_length = config.max_new_tokens + prompt_length
    elif default_max_length:  # HF: 20 new tokens (its default max_length), within the positions
        config.max_length = (config.max_length or 20) + prompt_length
        if getattr(model.config, "max_position_embeddings", None) is not None:
            config.max_length = min(config.max_length, model.config.max_position_embeddings)
    return config


def _unfilled(config: GenerationConfig, defaults: dict, prompt_length: int) -> bool:
    """Whether ``config`` lacks its length, has one ``max_new_tokens`` disagrees with, or lacks a
    field HF gives a default (a config HF prepared does none of these)."""
    if config.max_length is None or config.max_new_tokens not in (None, config.max_length - prompt_length):
        return True
    return any(v is not None and getattr(config, k, None) is None for k, v in defaults.items())


def check_drafts(drafts) -> tuple[ProposalLevel | None, list[torch.nn.Module]]:
    """``drafts`` as its proposal level (``"lookup"``, a ``LookupDraft`` or an ``OtherTokenizerDraft``,
    first only; None without one) and its list of models, or a TypeError / ValueError naming the
    entry."""
    if isinstance(drafts, (torch.nn.Module, str)) or not isinstance(drafts, Sequence):
        raise TypeError(f"drafts must be a list of models (smallest first), got {type(drafts).__name__}")
    drafts = list(drafts)
    proposal = None
    for i, d in enumerate(drafts):
        level = as_lookup(d) or (d if isinstance(d, ProposalLevel) else None)
        if level is not None:
            if i > 0:
                raise ValueError(
                    f"drafts[{i}] is {_level_name(level)}: it proposes from the host and verifies "
                    "nothing, so it can only be the first (smallest) level"
                )
            proposal = level
        elif not isinstance(d, torch.nn.Module):
            raise TypeError(
                f"drafts[{i}] must be a model (torch.nn.Module), 'lookup', a LookupDraft or an "
                f"OtherTokenizerDraft, got {type(d).__name__}"
            )
    check_exit_order(drafts)
    return proposal, drafts[1:] if proposal is not None else drafts


class DraftOrderWarning(UserWarning):
    """A draft model has more parameters than the draft model right above it, which verifies it."""


def warn_unless_smallest_first(models: Sequence[torch.nn.Module], first: int) -> None:
    """A warning where a user's draft model (``models``, from ``check_drafts``: ``drafts[first:]``) is
    larger than the draft model verifying it: exact either way (any draft is), but such a level spends
    more than it saves, so the list is most likely reversed. (A selector's pick is ordered by cost, not
    size: it is not checked.)"""
    sizes = [_parameter_count(m) for m in models]
    for i in range(len(models) - 1):
        if sizes[i] > sizes[i + 1]:
            names = [f"drafts[{first + j}] ({_model_name(models[j])}" for j in (i, i + 1)]
            warnings.warn(
                f"drafts are smallest first: {names[0]}, {sizes[i] / 1e6:.1f} M parameters) is verified "
                f"by {names[1]}, {sizes[i + 1] / 1e6:.1f} M). The output is exact either way, but a level "
                "verifying a larger draft rarely pays",
                DraftOrderWarning,
                stacklevel=3,
            )


def _parameter_count(model: torch.nn.Module) -> int:
    """``model``'s parameter count, counted at its first request and kept on it: walking its modules
    costs ~0.3 ms a model on a 2-core CPU, on every request of an adaptive run over four candidates
    1 % of a zoo request; the order warning needs only which of two drafts is larger, which editing a
    model in place hardly moves."""
    kept = attached(model, "parameter count")
    if "count" not in kept:
        kept["count"] = sum(p.numel() for p in model.parameters())
    return kept["count"]


def _model_name(model: torch.nn.Module) -> str:
    """The model's checkpoint name, or its class's where it has none."""
    path = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    return path.rstrip("/").rsplit("/", 1)[-1] or type(model).__name__


def level_names(request: Request) -> list[str]:
    """What each level of ``request`` is, bottom up, the target last (an adaptive request's levels
    are its candidates): ``lookup``, ``exitK`` for ``EarlyExit(target, K)``, a draft with another
    tokenizer as its model's name and ``(bridged)``, else the model's checkpoint name."""

    def name(level) -> str:
        if isinstance(level, LookupDraft):
            return "lookup"
        if isinstance(level, OtherTokenizerDraft):
            return f"{_model_name(level.model)} (bridged)"
        origin = exit_of(level)
        return f"exit{origin[1]}" if origin is not None else _model_name(level)

    return [name(level) for level in (*request.levels.drafts, request.target)]


def _level_name(level: ProposalLevel) -> str:
    return "a lookup level" if isinstance(level, LookupDraft) else f"an {type(level).__name__}"


def bridged_drafts(
    drafts, draft_tokenizers, target_tokenizer, T: Sequence[int] | None = None
) -> tuple[list, Sequence[int] | None]:
    """``drafts`` and ``T`` with the level whose tokenizer differs from the one above it (one such
    boundary at most) wrapped as an ``OtherTokenizerDraft``, the models below it (sharing its
    tokenizer) in its ``below`` with their block sizes (``T``'s, else ``DEFAULT_T``). A level's
    tokenizer is ``draft_tokenizers[i]``, or where that is None the tokenizer of the level above."""
    if isinstance(draft_tokenizers, (str, bytes)) or not isinstance(draft_tokenizers, Sequence):
        kind = type(draft_tokenizers).__name__
        raise TypeError(
            f"draft_tokenizers must be a list (one per draft, None: as the level above), got {kind}"
        )
    if isinstance(drafts, (torch.nn.Module, str)) or len(draft_tokenizers) != len(drafts):
        raise ValueError(
            f"draft_tokenizers needs one entry per draft (None: the tokenizer of the level above): "
            f"{len(draft_tokenizers)} for {len(drafts) if isinstance(drafts, Sequence) else 1} drafts"
        )
    drafts = list(drafts)
    boundary = _tokenizer_boundary(draft_tokenizers, target_tokenizer)
    if boundary is None:
        return drafts, T
    for i, d in enumerate(drafts[: boundary + 1]):
        if not isinstance(d, torch.nn.Module) and not (i == 0 < boundary and as_lookup(d)):
            where = "is given for" if i == boundary else f"puts drafts[{boundary}]'s tokenizer on"
            raise TypeError(
                f"draft_tokenizers[{boundary}] {where} drafts[{i}], which is not a model: {d!r} (a "
                "level at or below a tokenizer boundary must be a model in that tokenizer, or under "
                "it the lookup level, first)"
            )
    sizes = [DEFAULT_T] * len(drafts) if T is None else check_block_sizes(T, len(drafts), "T")
    bridged = OtherTokenizerDraft(
        drafts[boundary], draft_tokenizers[boundary], target_tokenizer,
        below=tuple(drafts[:boundary]), block_sizes=tuple(sizes[:boundary]),
    )  # fmt: skip
    return [bridged, *drafts[boundary + 1 :]], None if T is None else sizes[boundary:]


def _tokenizer_boundary(draft_tokenizers: Sequence, target_tokenizer) -> int | None:
    """The level whose tokenizer differs from the level's above it (None: every level shares the
    target's); a ValueError where two levels do, or where the target's tokenizer is missing."""
    boundary, above = None, target_tokenizer
    for i in reversed(range(len(draft_tokenizers))):  # top down: the highest boundary is found first
        tok = draft_tokenizers[i]
        if tok is None or (above is not None and same_tokenizer(tok, above)):
            continue
        if target_tokenizer is None:
            raise ValueError(
                "draft_tokenizers gives a draft its own tokenizer: the target's is needed too, as "
                "target_tokenizer= (target.generate(custom_generate=hsd_fast.generate, ...)) or "
                "tokenizer= (hsd_fast.wrap)"
            )
        if boundary is not None:
            raise ValueError(
                f"draft_tokenizers[{i}] differs from draft_tokenizers[{boundary}] above it: a hierarchy "
                "crosses one tokenizer boundary at most (the levels below it share its tokenizer)"
            )
        boundary, above = i, tok
    return boundary


def check_input_ids(input_ids, model_kwargs: dict) -> None:
    """The prompt as the engine needs it: a [batch, length] integer tensor (and no inputs_embeds)."""
    if model_kwargs.get("inputs_embeds") is not None:
        raise ValueError(
            "hsd_fast needs input_ids, not inputs_embeds: every level embeds the tokens itself (a draft "
            "cannot reuse the target's embeddings)"
        )
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(
            f"input_ids must be a torch.Tensor of token ids [batch, length], got {type(input_ids).__name__}"
        )
    if input_ids.dim() != 2:
        hint = " (one prompt: input_ids[None])" if input_ids.dim() == 1 else ""
        raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}{hint}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.numel() == 0:
        raise ValueError(
            f"input_ids must hold at least one token per row, got shape {tuple(input_ids.shape)}"
        )


def _check_models_and_options(model, drafts, input_ids, config) -> None:
    """Every model runnable exactly, all on the prompt's device, and no option HSD cannot honour."""
    check_model(model, "target")
    for i, d in enumerate(drafts):
        check_model(d, f"draft {i}")
    check_devices(model, drafts, input_ids)
    check_generation_options(config)  # every field served, refused or without effect: one table


def _hf_prepared(
    model, input_ids, config, logits_processor, stopping_criteria, model_kwargs, tokenizer=None
) -> tuple:
    """The logits processors and stopping criteria as given, or, on a direct call (where HF prepared
    none), those HF's ``generate`` would build from ``config`` (stop strings with ``tokenizer``): no
    field is ignored either way."""
    direct = logits_processor is None or stopping_criteria is None
    if direct:
        config = copy.copy(config)  # HF sets the special-token tensors the processors use on it
        has_mask = model_kwargs.get("attention_mask") is not None
        model._prepare_special_tokens(config, has_mask, device=input_ids.device)
    if logits_processor is None:
        logits_processor = model._get_logits_processor(
            generation_config=config, input_ids_seq_length=input_ids.shape[1], encoder_input_ids=input_ids,
            logits_processor=LogitsProcessorList(), device=input_ids.device, model_kwargs=model_kwargs,
        )  # fmt: skip
    if direct:  # a caller's own criteria merged into HF's, as HF's generate merges them
        stopping_criteria = model._get_stopping_criteria(
            generation_config=config,
            stopping_criteria=StoppingCriteriaList(stopping_criteria or []),
            tokenizer=tokenizer,
        )
    return logits_processor, stopping_criteria


def _no_tokenizer():
    raise ValueError(
        "stop_strings need the model's tokenizer: pass stop_tokenizer=tokenizer (on "
        "target.generate(custom_generate=hsd_fast.generate, stop_strings=[...], stop_tokenizer=tok), whose "
        "tokenizer= HF drops), or use hsd_fast.wrap(target, drafts).generate(..., stop_strings=[...], "
        "tokenizer=tok)"
    )


def _with_stop_strings(criteria, stop_strings, tokenizer) -> StoppingCriteriaList:
    """``criteria`` with HF's ``StopStringCriteria(tokenizer, stop_strings)`` where HF's
    ``_get_stopping_criteria`` puts it (after the length and time limits); as given without
    ``stop_strings``."""
    criteria = StoppingCriteriaList(criteria or [])
    if stop_strings is None:
        return criteria
    if tokenizer is None:
        _no_tokenizer()
    limits = (MaxLengthCriteria, MaxTimeCriteria)
    at = next((i for i, c in enumerate(criteria) if not isinstance(c, limits)), len(criteria))
    criteria.insert(at, StopStringCriteria(tokenizer, stop_strings))
    return criteria


def _extra_stopping(criteria, config, eos_ids: list[int]) -> StoppingCriteriaList | None:
    """The criteria to replay on the committed tokens (``stopping.StopChecker``), or None where they
    are only the length budget and EOS the ledger applies itself (no checker, no cost). Refused: an
    assistant's confidence stop (it needs scores), and a length or EOS criterion that disagrees with
    the config the ledger runs by (a user's ``MaxLengthCriteria`` or ``EosTokenCriteria``)."""
    extra = False
    for c in criteria:
        name = type(c).__name__
        if isinstance(c, REFUSED_STOPPING):
            raise ValueError(
                f"hsd_fast cannot apply the stopping criterion {name}: it reads the scores of an "
                "assistant model, which a drop-in generate does not pass (HF passes None too)"
            )
        if isinstance(c, MaxLengthCriteria) and c.max_length != config.max_length:
            raise ValueError(
                f"hsd_fast cannot apply {name}(max_length={c.max_length}) with max_length="
                f"{config.max_length}: set the length with max_new_tokens= or max_length="
            )
        if isinstance(c, EosTokenCriteria):
            ids = sorted({int(e) for e in torch.as_tensor(c.eos_token_id).reshape(-1).tolist()})
            if ids != sorted(set(eos_ids)):
                raise ValueError(
                    f"hsd_fast cannot apply {name} with ids {ids} while eos_token_id is {eos_ids or None}: "
                    "set the ids with eos_token_id="
                )
        extra = extra or not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))
    return StoppingCriteriaList(criteria) if extra else None


def _prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, vocab: int) -> list[torch.Tensor]:
    """Rows without their left padding (positions then follow HF's cumsum(mask) - 1)."""
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask must have input_ids' shape {tuple(input_ids.shape)}, "
            f"got {tuple(attention_mask.shape)}"
        )
    mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    lengths = mask.sum(1)
    right_aligned = mask[:, -1].all() and torch.equal(
        mask, torch.arange(mask.shape[1], device=mask.device)[None, :] >= (mask.shape[1] - lengths)[:, None]
    )
    if not right_aligned:  # an empty row fails the check too: say which it is
        empty = (lengths == 0).nonzero().flatten().tolist()
        if empty:
            raise ValueError(
                f"row{'s' if len(empty) > 1 else ''} {', '.join(map(str, empty))} of attention_mask "
                f"{'are' if len(empty) > 1 else 'is'} all zeros: every row needs at least one prompt token"
            )
        raise ValueError("hsd_fast needs left padding (padding_side='left') and no holes in attention_mask")
    tokens = input_ids[mask]
    # once per request (a host sync): an id outside the vocabulary would index past an embedding
    if tokens.numel() and not (int(tokens.min()) >= 0 and int(tokens.max()) < vocab):
        raise ValueError(
            f"input_ids must lie in [0, {vocab}) (the target's vocabulary), got ids from "
            f"{int(tokens.min())} to {int(tokens.max())}"
        )
    return [row[m] for row, m in zip(input_ids, mask, strict=True)]


def _eos_ids(config) -> list[int]:
    eos = config.eos_token_id
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)]


def _pad_id(config, eos_ids: list[int]) -> int:
    if config.pad_token_id is not None:
        return int(config.pad_token_id)
    return eos_ids[0] if eos_ids else 0
