"""`hsd_fast.generate`: HSD as a drop-in ``custom_generate`` for ``model.generate``.

    out = target.generate(ids, custom_generate=hsd_fast.generate, drafts=[d0, d1], T=[4, 2],
                          do_sample=True, max_new_tokens=64)

transformers prepares the generation config, the logits processors and the stopping criteria, then calls
this function. Extra arguments (``drafts``, ``T``, ``seed``) must be named parameters here or HF rejects
them (docs/design.md, "Named extra kwargs"). ``drafts`` are ordered smallest first; level 0 drafts, the
target verifies last; the first may be ``"lookup"`` (a ``LookupDraft``: proposals found in the row's own
context, no model). ``T[i]`` is the block size: the tokens level i must emit before level i+1
verifies; the default is ``hsd_fast.request.DEFAULT_T`` at every level.

A call reads top-down: this module is the HF glue only (it finds HF's streamer, has
``hsd_fast.request`` check every argument once and freeze them into a ``Request``, runs that on
``engine.run_hsd``, and builds HF's output); the engine drives the level steps, which run the ops
and the ledger."""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from hsd_fast.engine import HSDResult, run_hsd
from hsd_fast.hf_runner import HFRunner, level_runners, models_held
from hsd_fast.hierarchy_types import Hierarchy
from hsd_fast.request import Levels, Request, build_request, level_names, resolve_levels
from hsd_fast.stats import HSDStats
from hsd_fast.stopping import StopChecker
from hsd_fast.switching_types import Adaptive, Policy
from hsd_fast.tree import Tree


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
    adapt: bool | Policy | Adaptive = False,
    trees: Sequence[Tree] = (),
    hsd_levels: Levels | None = None,
    stop_strings: str | Sequence[str] | None = None,
    stop_tokenizer=None,
    target_tokenizer=None,
    draft_tokenizers: Sequence[Any] | None = None,
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
    until this hierarchy has decoded for as long as compiling it costs, compiled from then on
    (compiling costs tens of seconds on a CPU per step shape; a later process loads the compiled
    steps from inductor's cache in a few seconds each, ``hsd_fast.graph_cache``, and waits for what
    the last process that compiled them spent, ``hsd_fast.compile_price``, at most
    ``hsd_fast.engine.AUTO_COMPILE_AFTER_SECONDS``).
    ``tree``: the first draft drafts this ``hsd_fast.Tree`` of candidates and the next level verifies
    it in one forward; ``T[0]``, checked like every block size, then stands for the tree's depth.
    Steps with a tree compile as the others do.

    ``adapt=True``: the hierarchy may change between rounds (docs/design.md, "Switching
    hierarchies"): ``drafts`` are then the *candidates* (smallest first, ``"lookup"`` allowed first),
    every round decodes with a sub-chain of them (no draft included) chosen by the built-in policy
    (``hsd_fast.ExploreThenCommit``), ``trees`` are token trees a round may draft, and ``hierarchy``
    (if given) is the first round's. ``adapt`` may also be your own policy (a function from an
    ``hsd_fast.Observation`` to an ``hsd_fast.Choice``) or an ``hsd_fast.Adaptive``. The output is
    the target's whatever the policy chooses; ``output_hsd_stats=True`` lists every hierarchy used
    (``HSDStats.hierarchies``).

    Streaming (batch size 1): ``target.generate(..., streamer=s)`` puts the prompt into ``s`` and then
    drops it (docs/design.md, "The streamer is dropped"); this function finds it in HF's call and puts
    the committed tokens in order. ``hsd_fast.wrap`` passes its streamer as ``hsd_streamer`` (it is put
    the prompt here). Either way ``s.end()`` is called once when this function returns or raises, so a
    consumer such as ``TextIteratorStreamer`` never waits forever. An error HF raises itself before it
    calls this function leaves the streamer as HF's own ``generate`` would (no ``end()``); the
    wrapper ends it then too. ``hsd_levels``: the wrapper's levels, resolved when it was made (in
    place of ``drafts``/``T``/``tree``/``hierarchy``).

    Stopping: every criterion HF prepared is applied as its unassisted ``generate`` applies it
    (``max_time``, a user's ``stopping_criteria=``), checked on every committed token in order.
    ``stop_strings`` with ``stop_tokenizer``: hsd_fast's own keywords, since HF drops ``tokenizer=``
    before it calls this function (``hsd_fast.wrap(...).generate`` takes ``stop_strings=`` with
    ``tokenizer=``; a direct call takes either spelling).

    Drafts with another tokenizer (docs/design.md, "Drafts with another tokenizer"):
    ``draft_tokenizers`` gives one tokenizer per draft (None: the tokenizer of the level above), with
    ``target_tokenizer`` the target's (HF drops ``tokenizer=`` and ``assistant_tokenizer=`` before it
    calls this function). One level may have another tokenizer than the level above it: it drafts in
    its own tokens and proposes through a byte bridge (exact, greedy or sampled); the drafts below it
    share its tokenizer and draft for it in its own tokens.
    """
    dropped = _dropped_by_hf(sys._getframe(1))
    streamer = EndOnce.of(hsd_streamer)
    prompt_streamed = False
    if streamer is None:  # HF's own streamer, if it took one: it already holds the prompt
        streamer, prompt_streamed = EndOnce.of(dropped.get("streamer")), True
    try:
        if hsd_levels is None:
            levels = resolve_levels(
                drafts, T, tree, hierarchy, adapt, trees, dropped.get("assistant_model"),
                draft_tokenizers, target_tokenizer,
            )  # fmt: skip
        else:  # the wrapper's (it refuses assistant_model= per call)
            levels = hsd_levels
        if stop_tokenizer is None:  # a direct call may name it as HF does
            stop_tokenizer = model_kwargs.pop("tokenizer", None)
        request = build_request(
            model, input_ids, levels, generation_config=generation_config, logits_processor=logits_processor,
            stopping_criteria=stopping_criteria, seed=seed, compile=compile, streamer=streamer,
            model_kwargs=model_kwargs, stop_strings=stop_strings, stop_tokenizer=stop_tokenizer,
        )  # fmt: skip
        return _hf_output(request, _run(request, prompt_streamed), output_hsd_stats)
    finally:
        if streamer is not None:
            streamer.end()


def _run(request: Request, prompt_streamed: bool) -> HSDResult:
    """``request`` on the engine, its models behind their runners (kept per model: their caches and
    compiled steps serve later calls), each model held by this call alone while it runs (a call on
    another thread that shares a model waits: docs/design.md, "Caches and slots"); the streamer gets
    the prompt first unless HF put it."""
    models = (*request.levels.models, request.target)
    proposal = request.levels.proposal
    with models_held((*models, *(() if proposal is None else proposal.models))):
        return _run_held(request, level_runners(models, request.vocab), prompt_streamed)


def _run_held(request: Request, model_runners: list[HFRunner], prompt_streamed: bool) -> HSDResult:
    levels, streamer = request.levels, request.streamer
    if streamer is not None and not prompt_streamed:
        streamer.put(request.input_ids.cpu())
    bottom = [] if levels.proposal is None else [levels.proposal]  # a proposal level runs no step
    runners = [*bottom, *model_runners]
    stop = None  # only the length budget and EOS: the ledger applies them, no checker
    if request.stopping is not None:
        stop = StopChecker(
            request.stopping, request.input_ids, [p.numel() for p in request.prompts], request.pad_id,
            request.max_new_tokens, request.pads_finished,
        )  # fmt: skip
    return run_hsd(
        runners,
        list(request.prompts),
        block_sizes=None if levels.adapt is not None else list(levels.T),
        max_new_tokens=request.max_new_tokens,
        eos_token_id=list(request.eos_ids),
        seeds=request.seed,
        temperature=request.transform.temperature,
        transform=request.transform,
        greedy=request.greedy,
        compile=request.compile,
        tree=levels.tree,
        adapt=levels.adapt,
        on_commit=None if streamer is None else lambda _row, toks: streamer.put(toks.cpu()),
        stop=stop,
        outputs=request.outputs,
    )


def _hf_output(request: Request, result: HSDResult, output_hsd_stats: bool):
    """HF's return value: the prompt (padding and all) then each row's new tokens, ``pad_id`` after
    a row that stopped before the longest."""
    ids = request.input_ids
    new = torch.full(
        (len(request.prompts), max(result.num_new_tokens)), request.pad_id, dtype=ids.dtype, device=ids.device
    )
    for r, (seq, n) in enumerate(zip(result.sequences, result.num_new_tokens, strict=True)):
        new[r, :n] = seq[len(seq) - n :]
    sequences = torch.cat([ids, new], dim=1)
    scores = logits = None
    if result.outputs is not None:
        scores, logits = result.outputs.per_step(result.num_new_tokens, request.pad_id)
    if output_hsd_stats:
        result.stats.level_names = level_names(request)
        return HSDGenerateOutput(sequences=sequences, scores=scores, logits=logits, hsd_stats=result.stats)
    if request.return_dict:
        return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores, logits=logits)
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


def _dropped_by_hf(caller: types.FrameType | None) -> dict[str, Any]:
    """The ``streamer=`` and ``assistant_model=`` that HF's ``generate`` took and did not pass on to
    this function, from the caller's frame, when the caller is HF's ``generate`` (transformers 5.17
    through 5.24 keep them in its locals of those names); empty otherwise (a direct call)."""
    try:
        if (
            caller is not None
            and caller.f_code.co_name == "generate"
            and caller.f_globals.get("__name__") == "transformers.generation.utils"
        ):
            return {name: caller.f_locals.get(name) for name in ("streamer", "assistant_model")}
        return {}
    finally:
        del caller  # a frame held from a local would keep every object of the call alive
