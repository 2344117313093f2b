"""`hsd_fast.generate`: HSD as a drop-in ``custom_generate`` for ``model.generate``.

    out = target.generate(ids, custom_generate=hsd_fast.generate, drafts=[d0, d1], T=[4, 2],
                          do_sample=True, max_new_tokens=64)

transformers prepares the generation config, the logits processors and the stopping criteria, then calls
this function. Extra arguments (``drafts``, ``T``, ``seed``) must be named parameters here or HF rejects
them (docs/design.md, "Named extra kwargs"). ``drafts`` are ordered smallest first; level 0 drafts, the
target verifies last. ``T[i]`` is the block size: the tokens level i must emit before level i+1
verifies; the default is ``DEFAULT_T`` at every level."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria
from transformers.generation.utils import GenerateDecoderOnlyOutput

from hsd_fast.compat import check_devices, check_model, hierarchy_vocab_size
from hsd_fast.engine import run_hsd
from hsd_fast.hf_runner import HFRunner
from hsd_fast.hierarchy import Hierarchy
from hsd_fast.processors import LogitsTransform
from hsd_fast.stats import HSDStats

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
    **model_kwargs,
) -> torch.Tensor | GenerateDecoderOnlyOutput:
    """Hierarchical speculative decoding with ``drafts`` (smallest first) under ``model``.

    Returns what HF's ``generate`` returns: the sequences ``[B, prompt + new]``, or a
    ``GenerateDecoderOnlyOutput`` when ``return_dict_in_generate=True``; with ``output_hsd_stats=True``
    an ``HSDGenerateOutput`` that also holds the ``HSDStats``. ``seed`` keys all randomness: one int
    (row r gets a seed derived from it and r) or one per row (a row then samples the same tokens alone
    or in any batch); by default it is drawn from torch's global generator, so ``torch.manual_seed``
    makes runs repeatable as with HF. ``hsd_streamer`` is how ``hsd_fast.wrap`` passes a streamer
    (HF drops ``streamer=`` before calling a custom generate). ``compile``: run the decoding steps
    through ``torch.compile`` (``True``), eagerly (``False``), or ``"auto"`` (the default): eagerly
    until this hierarchy has decoded for ``hsd_fast.engine.AUTO_COMPILE_AFTER_SECONDS``, compiled
    from then on (compiling costs tens of seconds on a CPU, once per process and step shape).
    """
    config = generation_config if generation_config is not None else model.generation_config
    if hierarchy is not None:  # from hsd_fast.select_hierarchy: its drafts and block sizes
        if drafts or T is not None:
            raise ValueError("pass either hierarchy= or drafts=/T=, not both")
        drafts, T = hierarchy.drafts, hierarchy.T
    drafts = list(drafts)
    T = [DEFAULT_T] * len(drafts) if T is None else list(T)
    _check_request(model, drafts, T, input_ids, config, stopping_criteria)

    vocab = hierarchy_vocab_size(model, drafts)
    transform = LogitsTransform(list(logits_processor or []))
    runners = [HFRunner.of(m, vocab) for m in (*drafts, model)]
    prompts = _prompts(input_ids, model_kwargs.get("attention_mask"))
    eos_ids = _eos_ids(config)
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())  # host value by design: keys the hash
    elif not isinstance(seed, int):
        seed = torch.as_tensor(seed, dtype=torch.int64)  # one per row: checked with the other settings

    if hsd_streamer is not None:
        if input_ids.shape[0] > 1:
            raise ValueError("a streamer only supports batch size 1 (as in HF)")
        hsd_streamer.put(input_ids.cpu())
    result = run_hsd(
        runners,
        prompts,
        block_sizes=T,
        max_new_tokens=config.max_length - input_ids.shape[1],
        eos_token_id=eos_ids,
        seeds=seed,
        temperature=transform.temperature,
        transform=transform,
        greedy=not config.do_sample,
        compile=compile,
        on_commit=None if hsd_streamer is None else lambda _row, toks: hsd_streamer.put(toks.cpu()),
    )
    if hsd_streamer is not None:
        hsd_streamer.end()
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


def _check_request(model, drafts, T, input_ids, config, stopping_criteria) -> None:
    check_model(model, "target")
    for i, d in enumerate(drafts):
        check_model(d, f"draft {i}")
    check_devices(model, drafts, input_ids)
    if len(T) != len(drafts):
        raise ValueError(f"T needs one block size per draft ({len(drafts)}), got {len(T)}: {T}")
    if any(int(t) < 1 for t in T):
        raise ValueError(f"every block size in T must be >= 1, got {T}")
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


def _prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[torch.Tensor]:
    """Rows without their left padding (positions then follow HF's cumsum(mask) - 1)."""
    if attention_mask is None:
        return list(input_ids)
    mask = attention_mask.bool()
    lengths = mask.sum(1)
    right_aligned = mask[:, -1].all() and torch.equal(
        mask, torch.arange(mask.shape[1], device=mask.device)[None, :] >= (mask.shape[1] - lengths)[:, None]
    )
    if not right_aligned:
        raise ValueError("hsd_fast needs left padding (padding_side='left') and no holes in attention_mask")
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
