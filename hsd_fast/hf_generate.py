"""`hsd_fast.generate`: HSD as a drop-in ``custom_generate`` for ``model.generate``.

    out = target.generate(ids, custom_generate=hsd_fast.generate, drafts=[d0, d1], T=[4, 2],
                          do_sample=True, max_new_tokens=64)

transformers prepares the generation config, the logits processors and the stopping criteria, then calls
this function. Extra arguments (``drafts``, ``T``, ``seed``) must be named parameters here or HF rejects
them (docs/design.md, "Named extra kwargs"). ``drafts`` are ordered smallest first; level 0 drafts, the
target verifies last; the first may be ``"lookup"`` (a ``LookupDraft``: proposals found in the row's own
context, no model). ``T[i]`` is the block size: the tokens level i must emit before level i+1
verifies; the default is ``DEFAULT_T`` at every level."""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria
from transformers.generation.utils import GenerateDecoderOnlyOutput

from hsd_fast.compat import check_devices, check_model, hierarchy_vocab_size
from hsd_fast.engine import check_block_sizes, run_hsd
from hsd_fast.hf_runner import HFRunner
from hsd_fast.hierarchy import Hierarchy
from hsd_fast.lookup import LookupDraft, as_lookup
from hsd_fast.processors import LogitsTransform
from hsd_fast.stats import HSDStats
from hsd_fast.tree import Tree

DEFAULT_T = 4
SUPPORTED_STOPPING = (MaxLengthCriteria, EosTokenCriteria)


@dataclass
class HSDGenerateOutput(GenerateDecoderOnlyOutput):
    """HF's output plus what HSD did (``HSDStats``: forwards, accepts, bonuses, rollbacks per level)."""

    hsd_stats: HSDStats | None = None


def generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    logits_processor=None,
    stopping_criteria=None,
    generation_config=None,
    drafts: Sequence[torch.nn.Module] = (),
    T: Sequence[int] | None = None,
    seed: int | Sequence[int] | torch.Tensor | None = None,
    output_hsd_stats: bool = False,
    hsd_streamer=None,
    hierarchy: Hierarchy | None = None,
    compile: bool | str = "auto",
    tree: Tree | None = None,
    **model_kwargs,
) -> torch.Tensor | GenerateDecoderOnlyOutput:
    """Hierarchical speculative decoding with ``drafts`` (smallest first) under ``model``.

    Returns what HF's ``generate`` returns: the sequences ``[B, prompt + new]``, or a
    ``GenerateDecoderOnlyOutput`` when ``return_dict_in_generate=True``; with ``output_hsd_stats=True``
    an ``HSDGenerateOutput`` that also holds the ``HSDStats``. ``seed`` keys all randomness: one int
    in ``[-2**63, 2**64)`` (row r gets a seed derived from it and r) or one per row (a row then samples
    the same tokens alone or in any batch); by default it is drawn from torch's global generator, so
    ``torch.manual_seed`` makes runs repeatable as with HF. ``compile``: run the decoding steps
    through ``torch.compile`` (``True``), eagerly (``False``), or ``"auto"`` (the default): eagerly
    until this hierarchy has decoded for ``hsd_fast.engine.AUTO_COMPILE_AFTER_SECONDS``, compiled
    from then on (compiling costs tens of seconds on a CPU, once per process and step shape).
    ``tree``: the first draft drafts this ``hsd_fast.Tree`` of candidates and the next level verifies
    it in one forward (``T[0]`` is then ignored; steps with a tree run uncompiled for now).

    Streaming (batch size 1): ``target.generate(..., streamer=s)`` puts the prompt into ``s`` and then
    drops it (docs/design.md, "The streamer is dropped"); this function finds it in HF's call and puts
    the committed tokens in order. ``hsd_fast.wrap`` passes its streamer as ``hsd_streamer`` (it is put
    the prompt here). Either way ``s.end()`` is called once when this function returns or raises, so a
    consumer such as ``TextIteratorStreamer`` never waits forever. An error HF raises itself before it
    calls this function leaves the streamer as HF's own ``generate`` would (no ``end()``); the
    wrapper ends it then too.
    """
    streamer = EndOnce.of(hsd_streamer)
    prompt_streamed = False
    if streamer is None:  # HF's own streamer, if it took one: it already holds the prompt
        streamer, prompt_streamed = EndOnce.of(_streamer_hf_dropped(sys._getframe(1))), True
    try:
        return _generate(
            model, input_ids, logits_processor, stopping_criteria, generation_config, drafts, T, seed,
            output_hsd_stats, streamer, prompt_streamed, hierarchy, compile, tree, model_kwargs,
        )  # fmt: skip
    finally:
        if streamer is not None:
            streamer.end()


def _generate(
    model, input_ids, logits_processor, stopping_criteria, generation_config, drafts, T, seed,
    output_hsd_stats, streamer, prompt_streamed, hierarchy, compile, tree, model_kwargs,
):  # fmt: skip
    config = generation_config if generation_config is not None else model.generation_config
    if hierarchy is not None:  # from hsd_fast.select_hierarchy: its drafts and block sizes
        if not isinstance(hierarchy, Hierarchy):
            raise TypeError(
                f"hierarchy must be a Hierarchy (from select_hierarchy), got {type(hierarchy).__name__}"
            )
        if drafts or T is not None or tree is not None:
            raise ValueError("pass either hierarchy= or drafts=/T=/tree=, not both")
        drafts, T, tree = hierarchy.drafts, hierarchy.T, hierarchy.tree
    lookup, drafts = check_drafts(drafts)
    bottom = [] if lookup is None else [lookup]  # a lookup level sits below the draft models
    num_drafts = len(bottom) + len(drafts)
    T = check_block_sizes([DEFAULT_T] * num_drafts if T is None else T, num_drafts, "T")
    check_input_ids(input_ids, model_kwargs)
    if hierarchy is not None:
        hierarchy.warn_unless_selected_for(input_ids.shape[0])
    _check_request(model, drafts, input_ids, config, stopping_criteria)
    vocab = hierarchy_vocab_size(model, drafts)
    prompts = _prompts(input_ids, model_kwargs.get("attention_mask"), vocab)
    max_new_tokens = config.max_length - input_ids.shape[1]
    _check_positions(model, drafts, max(p.numel() for p in prompts) + max_new_tokens)

    transform = LogitsTransform(list(logits_processor or []))
    runners = [*bottom, *(HFRunner.of(m, vocab) for m in (*drafts, model))]
    eos_ids = _eos_ids(config)
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())  # host value by design: keys the hash
    if streamer is not None:
        if input_ids.shape[0] > 1:
            raise ValueError("a streamer only supports batch size 1 (as in HF)")
        if not prompt_streamed:
            streamer.put(input_ids.cpu())
    result = run_hsd(
        runners,
        prompts,
        block_sizes=T,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_ids,
        seeds=seed,
        temperature=transform.temperature,
        transform=transform,
        greedy=not config.do_sample,
        compile=compile,
        tree=tree,
        on_commit=None if streamer is None else lambda _row, toks: streamer.put(toks.cpu()),
    )
    pad = _pad_id(config, eos_ids)
    width = max(result.num_new_tokens)
    new = torch.full((len(prompts), width), pad, dtype=input_ids.dtype, device=input_ids.device)
    for r, (seq, n) in enumerate(zip(result.sequences, result.num_new_tokens, strict=True)):
        new[r, :n] = seq[len(seq) - n :]
    sequences = torch.cat([input_ids, new], dim=1)
    if output_hsd_stats:
        return HSDGenerateOutput(sequences=sequences, hsd_stats=result.stats)
    if config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences


class EndOnce:
    """A streamer's ``put`` as is, and its ``end`` at most once: ``generate`` and the wrapper both
    end it on the way out, whichever comes first."""

    def __init__(self, streamer) -> None:
        self.streamer, self.ended = streamer, False

    @classmethod
    def of(cls, streamer) -> EndOnce | None:
        if streamer is None or isinstance(streamer, cls):
            return streamer
        return cls(streamer)

    def put(self, value: torch.Tensor) -> None:
        self.streamer.put(value)

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.streamer.end()


def _streamer_hf_dropped(caller: types.FrameType | None):
    """The ``streamer=`` that HF's ``generate`` took and did not pass on to this function, from the
    caller's frame, when the caller is HF's ``generate`` (transformers 5.17 through 5.23 keep it in
    the local ``streamer``); None otherwise (a direct call, or no streamer)."""
    try:
        if (
            caller is not None
            and caller.f_code.co_name == "generate"
            and caller.f_globals.get("__name__") == "transformers.generation.utils"
        ):
            return caller.f_locals.get("streamer")
        return None
    finally:
        del caller  # a frame held from a local would keep every object of the call alive


def check_drafts(drafts) -> tuple[LookupDraft | None, list[torch.nn.Module]]:
    """``drafts`` as its lookup level (``"lookup"`` or a ``LookupDraft``, first only; None without
    one) and its list of models, or a TypeError / ValueError naming the entry."""
    if isinstance(drafts, (torch.nn.Module, str)) or not isinstance(drafts, Sequence):
        raise TypeError(f"drafts must be a list of models (smallest first), got {type(drafts).__name__}")
    drafts = list(drafts)
    lookup = None
    for i, d in enumerate(drafts):
        if as_lookup(d) is not None:
            if i > 0:
                raise ValueError(
                    f"drafts[{i}] is a lookup level: it has no model to verify anything, so it can only "
                    "be the first (smallest) level"
                )
            lookup = as_lookup(d)
        elif not isinstance(d, torch.nn.Module):
            raise TypeError(
                f"drafts[{i}] must be a model (torch.nn.Module), 'lookup' or a LookupDraft, got "
                f"{type(d).__name__}"
            )
    return lookup, drafts[1:] if lookup is not None else drafts


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


def _check_request(model, drafts, input_ids, config, stopping_criteria) -> None:
    check_model(model, "target")
    for i, d in enumerate(drafts):
        check_model(d, f"draft {i}")
    check_devices(model, drafts, input_ids)
    if getattr(config, "num_beams", 1) > 1:
        raise ValueError("hsd_fast does not support beam search (num_beams > 1)")
    for flag in ("output_scores", "output_logits", "output_attentions", "output_hidden_states"):
        if getattr(config, flag, False):
            raise ValueError(f"hsd_fast does not support {flag}=True")
    unsupported = [
        type(c).__name__ for c in (stopping_criteria or []) if not isinstance(c, SUPPORTED_STOPPING)
    ]
    if unsupported:
        raise ValueError(
            f"hsd_fast cannot apply the stopping criteria {unsupported}; supported: "
            f"{', '.join(c.__name__ for c in SUPPORTED_STOPPING)} (max_length / max_new_tokens, EOS)"
        )


def _check_positions(model: torch.nn.Module, drafts: Sequence[torch.nn.Module], needed: int) -> None:
    """Refuse, before anything is allocated, a request whose longest row needs more positions than
    some level has: ``needed`` = prompt + max_new_tokens (the last token drawn is never fed, but a
    verification feeds the one before it, at position ``needed - 1``)."""
    for role, m in [*((f"draft {i}", d) for i, d in enumerate(drafts)), ("target", model)]:
        limit = getattr(m.config, "max_position_embeddings", None)
        if limit is not None and needed > limit:
            raise ValueError(
                f"prompt + max_new_tokens = {needed} positions, beyond the max_position_embeddings = "
                f"{limit} of the {role} ({type(m).__name__}): lower max_new_tokens"
            )


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
    if not right_aligned:
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
