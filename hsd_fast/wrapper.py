"""`hsd_fast.wrap(target, drafts)`: a model-like object whose `.generate` runs HSD and streams.

HF drops the ``streamer`` before it calls a ``custom_generate`` callable (docs/design.md, "The streamer
is dropped"). ``hsd_fast.generate`` finds it in HF's call all the same, but the wrapper does not rely on
that: it takes the streamer out of the kwargs, hands it to ``hsd_fast.generate`` under its own name,
and the engine feeds it the prompt, then each committed token in order, then ``end()``: HF's streamer
contract. ``end()`` comes whatever happens, an error raised by HF's own checks included. The drafts
and the block sizes are checked when the wrapper is made."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hsd_fast.engine import check_block_sizes
from hsd_fast.hf_generate import DEFAULT_T, EndOnce, check_drafts, check_input_ids, generate
from hsd_fast.hierarchy import Hierarchy
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
    ) -> None:
        if hierarchy is not None:
            if drafts or T is not None or tree is not None:
                raise ValueError("pass either hierarchy= or drafts=/T=/tree=, not both")
            drafts, T, tree = hierarchy.drafts, hierarchy.T, hierarchy.tree
        if not isinstance(target, torch.nn.Module):
            raise TypeError(f"target must be a model (torch.nn.Module), got {type(target).__name__}")
        self.target = target
        lookup, models = check_drafts(drafts)
        self.drafts = [*([] if lookup is None else [lookup]), *models]  # "lookup" as its LookupDraft
        self.T = check_block_sizes([DEFAULT_T] * len(self.drafts) if T is None else T, len(self.drafts), "T")
        self.compile, self.tree = compile, tree
        self.hierarchy = hierarchy  # kept for its batch: generate warns when it runs another

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not found on the wrapper: config, device, generation_config, ...
        # (and, while copy or pickle rebuild the object, before `target` is set: no recursion then)
        target = self.__dict__.get("target")
        if target is None:
            raise AttributeError(name)
        return getattr(target, name)

    def generate(self, inputs: torch.Tensor | None = None, **kwargs: Any) -> Any:
        for name in ("custom_generate", "assistant_model", "drafts", "T", "hierarchy", "tree"):
            if kwargs.get(name) is not None:
                raise ValueError(f"HSDModel.generate: {name}= is set by the wrapper, not per call")
        # HF's own errors for a list or a 1-D tensor are an AttributeError and an IndexError: say what
        # is wrong before handing over
        check_input_ids(inputs if inputs is not None else kwargs.get("input_ids"), kwargs)
        streamer = EndOnce.of(kwargs.pop("streamer", None))
        try:
            ids = inputs if inputs is not None else kwargs["input_ids"]
            if streamer is not None and ids.shape[0] > 1:
                raise ValueError("a streamer only supports batch size 1 (as in HF)")
            if self.hierarchy is not None:
                self.hierarchy.warn_unless_selected_for(ids.shape[0])
            return self.target.generate(
                inputs,
                custom_generate=generate,
                drafts=self.drafts,
                T=self.T,
                tree=self.tree,
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
) -> HSDModel:
    """HSD with ``drafts`` (smallest first) under ``target``, or the ``hierarchy`` that
    ``hsd_fast.select_hierarchy`` picked: ``wrap(target, drafts).generate(...)``. ``compile`` and
    ``tree`` as in ``hsd_fast.generate``."""
    return HSDModel(target, drafts, T, hierarchy, compile, tree)
