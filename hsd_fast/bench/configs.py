"""The configurations a benchmark compares: each one a way to call ``generate`` on a batch.

Hugging Face's own: ``generate`` as users call it (eager, dynamic cache), ``generate`` compiled with
its static cache (on a CPU, HF compiles only when told to: ``cache_implementation="static"`` and a
``CompileConfig`` marked for all devices, the way transformers' own tests do it), assisted
generation with a draft (its default schedule, and a fixed number of draft tokens), and prompt
lookup. Ours: the engine with no draft (``drafts=[]``: what compiling alone gives), hierarchies
(one draft or several, each with its block sizes T; ``"lookup"`` in a chain is the lookup level), and
the adaptive engine, which chooses among the drafts round by round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from hsd_fast import round_steps
from hsd_fast.hf_generate import generate as hsd_generate
from hsd_fast.lookup import as_lookup
from hsd_fast.other_tokenizer import OtherTokenizerDraft
from hsd_fast.stats import HSDStats
from hsd_fast.tree import Tree

Generate = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, HSDStats | None]]
BATCH_ONE = (1,)
"""Where HF assisted generation and prompt lookup run: they refuse larger batches."""


@dataclass
class Config:
    name: str
    family: str  # "hf", "hf compiled", "hf assisted", "hf lookup", "ours"
    generate: Generate  # (input_ids [B, L], attention_mask [B, L]) -> (sequences, stats or None)
    batches: tuple[int, ...] | None = None  # the batch sizes it runs at (None: every one)
    chain: tuple[str, ...] = ()  # ours: the drafts, smallest first
    T: tuple[int, ...] = ()
    predicted: dict[int, float] = field(default_factory=dict)  # batch -> predicted seconds per row-token

    def runs_at(self, batch: int) -> bool:
        return self.batches is None or batch in self.batches


def _hf_kwargs(sampling: dict, max_new_tokens: int) -> dict:
    """No EOS (every row runs to ``max_new_tokens``) unless the setting names one."""
    return {"eos_token_id": None, **sampling, "max_new_tokens": max_new_tokens, "pad_token_id": 0}


def hf_generate(target: torch.nn.Module, sampling: dict, max_new_tokens: int) -> Config:
    kwargs = _hf_kwargs(sampling, max_new_tokens)

    def run(ids, mask):
        return target.generate(ids, attention_mask=mask, **kwargs), None

    return Config("HF generate", "hf", run)


def hf_compiled(target: torch.nn.Module, sampling: dict, max_new_tokens: int) -> Config:
    from transformers import CompileConfig

    compile_config = CompileConfig(fullgraph=True, mode="default")
    compile_config._compile_all_devices = True  # HF compiles on CUDA only unless told (see module doc)
    kwargs = _hf_kwargs(sampling, max_new_tokens) | {
        "cache_implementation": "static",
        "compile_config": compile_config,
    }

    def run(ids, mask):
        return target.generate(ids, attention_mask=mask, **kwargs), None

    return Config("HF generate, compiled static cache", "hf compiled", run)


def hf_assisted(
    target: torch.nn.Module, draft_name: str, draft: torch.nn.Module | OtherTokenizerDraft, sampling: dict,
    max_new_tokens: int, num_tokens: int | None = None,
) -> Config:  # fmt: skip
    """HF assisted generation; ``num_tokens``: a fixed number of draft tokens per round (None: HF's
    default schedule, which adapts the number). A draft with another tokenizer runs HF's own path for
    such a pair (``tokenizer=`` / ``assistant_tokenizer=``, "universal assisted generation")."""
    kwargs = _hf_kwargs(sampling, max_new_tokens) | {"assistant_model": draft}
    if isinstance(draft, OtherTokenizerDraft):
        kwargs |= {
            "assistant_model": draft.model,
            "tokenizer": draft.target_tokenizer,
            "assistant_tokenizer": draft.tokenizer,
        }
    if num_tokens is not None:
        kwargs |= {"num_assistant_tokens": num_tokens, "num_assistant_tokens_schedule": "constant"}
    label = "default schedule" if num_tokens is None else f"{num_tokens} tokens"

    def run(ids, mask):
        return target.generate(ids, attention_mask=mask, **kwargs), None

    return Config(
        f"HF assisted, {draft_name} ({label})", "hf assisted", run, batches=BATCH_ONE, chain=(draft_name,)
    )


def hf_early_exit(target: torch.nn.Module, k: int, sampling: dict, max_new_tokens: int) -> Config:
    """HF's own self-speculation (``assistant_early_exit=k``): the target's first ``k`` layers draft."""
    kwargs = _hf_kwargs(sampling, max_new_tokens) | {"assistant_early_exit": k}

    def run(ids, mask):
        return target.generate(ids, attention_mask=mask, **kwargs), None

    return Config(f"HF assisted, early exit at layer {k}", "hf assisted", run, batches=BATCH_ONE)


def hf_lookup(target: torch.nn.Module, sampling: dict, max_new_tokens: int, num_tokens: int = 10) -> Config:
    kwargs = _hf_kwargs(sampling, max_new_tokens) | {"prompt_lookup_num_tokens": num_tokens}

    def run(ids, mask):
        return target.generate(ids, attention_mask=mask, **kwargs), None

    return Config(f"HF prompt lookup ({num_tokens} tokens)", "hf lookup", run, batches=BATCH_ONE)


def ours(
    target: torch.nn.Module,
    drafts: dict[str, torch.nn.Module | OtherTokenizerDraft],
    chain: Sequence[str],
    T: Sequence[int],
    sampling: dict,
    max_new_tokens: int,
    compile: bool = True,
    name: str | None = None,
    tree: Tree | None = None,
) -> Config:
    """Our engine with the drafts ``chain`` (smallest first) and block sizes ``T``; ``tree``: the
    smallest drafts that token tree (``T[0]`` is then unused)."""
    kwargs = _hf_kwargs(sampling, max_new_tokens) | {"compile": compile, "output_hsd_stats": True, "seed": 0}
    if tree is not None:
        kwargs["tree"] = tree
    models = [as_lookup(d) or drafts[d] for d in chain]  # "lookup": the model-free level

    def run(ids, mask):
        out = target.generate(
            ids, attention_mask=mask, custom_generate=hsd_generate, drafts=models, T=list(T), **kwargs
        )
        return out.sequences, out.hsd_stats

    label = name or ("ours, no draft" if not chain else f"ours, {' > '.join([*chain, 'target'])} T={list(T)}")
    if tree is not None and name is None:
        label = f"ours, {' > '.join([*chain, 'target'])}, tree {tree} T={list(T[1:])}"
    return Config(label, "ours", run, chain=tuple(chain), T=tuple(T))


def steps_read_one_at_a_time(config: Config) -> Config:
    """``config`` (ours) with every step read by the host before the next is launched
    (``round_steps.PAIRED_ROUNDS`` off): what pairing a draft with its verification saves."""
    paired_run = config.generate

    def run(ids, mask):
        round_steps.PAIRED_ROUNDS = False
        try:
            return paired_run(ids, mask)
        finally:
            round_steps.PAIRED_ROUNDS = True

    return replace(config, name=f"{config.name}, steps read one at a time", generate=run)


def ours_adaptive(
    target: torch.nn.Module,
    drafts: dict[str, torch.nn.Module],
    candidates: Sequence[str],
    sampling: dict,
    max_new_tokens: int,
    compile: bool = True,
    policy=True,
    policy_name: str = "built-in policy",
) -> Config:
    """Our engine choosing its hierarchy round by round over ``candidates`` (smallest first) with
    ``policy`` (``adapt=``: True for the built-in one, or a policy such as a ``LatencyController``,
    which keeps what it learns from one call to the next; a dict: one per batch size)."""
    kwargs = _hf_kwargs(sampling, max_new_tokens) | {"compile": compile, "output_hsd_stats": True, "seed": 0}
    models = [as_lookup(d) or drafts[d] for d in candidates]

    def run(ids, mask):
        adapt = policy[len(ids)] if isinstance(policy, dict) else policy
        out = target.generate(
            ids, attention_mask=mask, custom_generate=hsd_generate, drafts=models, adapt=adapt, **kwargs
        )
        return out.sequences, out.hsd_stats

    label = f"ours, adaptive over {', '.join(candidates)} ({policy_name})"
    return Config(label, "ours", run)  # no fixed chain: the name says what it chooses among
