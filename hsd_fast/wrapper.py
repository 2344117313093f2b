"""`hsd_fast.wrap(target, drafts)`: a model-like object whose `.generate` runs HSD and streams.

HF drops the ``streamer`` before it calls a ``custom_generate`` callable (docs/design.md, "The streamer
is dropped"). ``hsd_fast.generate`` finds it in HF's call all the same, but the wrapper does not rely on
that: it takes the streamer out of the kwargs, hands it to ``hsd_fast.generate`` under its own name,
and the engine feeds it the prompt, then each committed token in order, then ``end()``: HF's streamer
contract. ``end()`` comes whatever happens, an error raised by HF's own checks included. The levels
(drafts, block sizes, tree, or a hierarchy) and ``compile`` are resolved and checked once, when the
wrapper is made (``hsd_fast.request.resolve_levels``), and handed to ``hsd_fast.generate`` as they are;
every other check of a call is the request's (``hsd_fast.request``), as for a direct call.

HF also drops ``tokenizer=`` before a ``custom_generate`` callable and refuses ``stop_strings`` without
it (docs/design.md, "Stop strings and the tokenizer"): the wrapper hands both to ``hsd_fast.generate``
under its own keywords, ``stop_strings`` and ``stop_tokenizer``, before HF sees them."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from hsd_fast.hf_generate import EndOnce, generate
from hsd_fast.hierarchy_types import Hierarchy
from hsd_fast.proposal_level import ProposalLevel
from hsd_fast.request import Levels, check_compile, check_input_ids, resolve_levels
from hsd_fast.switching_types import Adaptive, Policy
from hsd_fast.tree import Tree


class HSDModel:
    """The target with its drafts. ``.generate`` takes HF's kwargs and returns HF's types; every
    other attribute (``config``, ``device``, ``generation_config``, ...) is the target's."""

    def __init__(
        self,
        target: torch.nn.Module,
        drafts: Sequence[torch.nn.Module] = (),
        T: Sequence[int] | None = None,
        hierarchy: Hierarchy | None = None,
        compile: bool | str = "auto",
        tree: Tree | None = None,
        adapt: bool | Policy | Adaptive = False,
        trees: Sequence[Tree] = (),
        assistant_model: torch.nn.Module | None = None,
        tokenizer: Any = None,
        draft_tokenizers: Sequence[Any] | None = None,
    ) -> None:
        if not isinstance(target, torch.nn.Module):
            raise TypeError(f"target must be a model (torch.nn.Module), got {type(target).__name__}")
        self.target = target
        self.tokenizer = tokenizer  # the target's: the byte bridge's other side, and stop strings'
        self.levels: Levels = resolve_levels(
            drafts, T, tree, hierarchy, adapt, trees, assistant_model, draft_tokenizers, tokenizer
        )  # once: every call reuses them
        check_compile(compile)
        self.compile = compile

    @property
    def drafts(self) -> list[torch.nn.Module | ProposalLevel]:
        """The levels under the target, smallest first (``"lookup"`` as its ``LookupDraft``)."""
        return self.levels.drafts

    @property
    def T(self) -> list[int]:
        return list(self.levels.T)

    @property
    def tree(self) -> Tree | None:
        return self.levels.tree

    @property
    def hierarchy(self) -> Hierarchy | None:
        return self.levels.hierarchy

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not found on the wrapper: config, device, generation_config, ...
        # (and, while copy or pickle rebuild the object, before `target` is set: no recursion then)
        target = self.__dict__.get("target")
        if target is None:
            raise AttributeError(name)
        return getattr(target, name)

    def generate(self, inputs: torch.Tensor | None = None, **kwargs: Any) -> Any:
        for name in (
            "custom_generate",
            "assistant_model",
            "drafts",
            "T",
            "hierarchy",
            "tree",
            "adapt",
            "trees",
        ):
            if kwargs.get(name) is not None:
                raise ValueError(f"HSDModel.generate: {name}= is set by the wrapper, not per call")
        # HF's own errors for a list or a 1-D tensor are an AttributeError and an IndexError: say what
        # is wrong before handing over
        check_input_ids(inputs if inputs is not None else kwargs.get("input_ids"), kwargs)
        if "stop_tokenizer" in kwargs and kwargs.get("tokenizer") is not None:
            raise ValueError("HSDModel.generate: pass the tokenizer once, as tokenizer=")
        if kwargs.get("tokenizer") is not None:  # HF would drop it: hsd_fast's own keyword
            kwargs["stop_tokenizer"] = kwargs.pop("tokenizer")
        elif self.tokenizer is not None and "stop_tokenizer" not in kwargs:
            kwargs["stop_tokenizer"] = self.tokenizer
        config = kwargs.get("generation_config")
        if kwargs.get("stop_strings") is None and getattr(config, "stop_strings", None) is not None:
            config = copy.deepcopy(config)  # HF would refuse them: moved to hsd_fast's keyword
            kwargs["stop_strings"], config.stop_strings = config.stop_strings, None
            kwargs["generation_config"] = config
        streamer = EndOnce.of(kwargs.pop("streamer", None))
        try:
            return self.target.generate(
                inputs,
                custom_generate=generate,
                hsd_levels=self.levels,
                hsd_streamer=streamer,
                **{"compile": self.compile, **kwargs},  # compile= may be given per call
            )
        finally:  # whatever failed, and wherever (HF's checks included), the consumer is told
            if streamer is not None:
                streamer.end()


def wrap(
    target: torch.nn.Module,
    drafts: Sequence[torch.nn.Module] = (),
    T: Sequence[int] | None = None,
    hierarchy: Hierarchy | None = None,
    compile: bool | str = "auto",
    tree: Tree | None = None,
    adapt: bool | Policy | Adaptive = False,
    trees: Sequence[Tree] = (),
    assistant_model: torch.nn.Module | None = None,
    tokenizer: Any = None,
    draft_tokenizers: Sequence[Any] | None = None,
) -> HSDModel:
    """HSD with ``drafts`` (smallest first) under ``target``, or the ``hierarchy`` that
    ``hsd_fast.select_hierarchy`` picked: ``wrap(target, drafts).generate(...)``. ``compile``,
    ``tree``, ``adapt`` and ``trees`` as in ``hsd_fast.generate``; ``assistant_model``, as in HF's
    assisted generation: ``drafts=[assistant_model]``. ``tokenizer``: the target's (the default for
    ``stop_strings``); with ``draft_tokenizers`` (one per draft, None: the tokenizer of the level
    above) one draft may have another tokenizer than the level above it (``hsd_fast.generate``)."""
    return HSDModel(
        target,
        drafts,
        T,
        hierarchy,
        compile,
        tree,
        adapt,
        trees,
        assistant_model,
        tokenizer,
        draft_tokenizers,
    )
