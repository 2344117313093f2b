"""What hsd_fast does with each field of HF's ``GenerationConfig``: the one table.

Every field a ``transformers.GenerationConfig`` holds is classified here, so that none that changes
decoding is silently ignored (``tests/test_generation_options.py`` walks the installed
``GenerationConfig`` and fails on a field this table does not name):

- ``SERVED``: hsd_fast serves it (the note says how).
- ``PROCESSOR``: HF turns it into a logits processor or a stopping criterion before it calls
  ``custom_generate``, which hsd_fast refuses by its class name: a processor that keeps a model, a
  batch layout or per-row state of its own (``hsd_fast.processors``), an assistant's confidence stop
  (``hsd_fast.stopping``). Every other processor is served at every level (``hsd_fast.processors``
  says how) and so is every other stopping criterion.
- ``REFUSED``: a value other than an inactive one raises a ValueError naming the field, its value and
  the reason or what to use instead (``check_generation_options``, called by ``hsd_fast.request``).
- ``NO_EFFECT``: it cannot change the tokens hsd_fast decodes (the note says why).

A field the table does not know (a newer transformers, a custom entry) is not checked at run time;
the test is what catches it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SERVED, PROCESSOR, REFUSED, NO_EFFECT = "served", "processor", "refused", "no effect"


@dataclass(frozen=True)
class Option:
    """How hsd_fast treats one ``GenerationConfig`` field. For ``REFUSED``: the values at which the
    field does nothing (``inactive``: None, HF's default), or, where only some values are refused,
    those (``refused_values``); ``note`` is the reason, with ``{value}`` standing for the value."""

    treatment: str
    note: str
    inactive: tuple = (None,)
    refused_values: tuple | None = None

    def refuses(self, value: Any) -> bool:
        if self.treatment != REFUSED:
            return False
        if self.refused_values is not None:
            return _among(value, self.refused_values)
        return not _among(value, self.inactive)


def _among(value: Any, values: tuple) -> bool:
    """``value`` is one of ``values`` (None, or an equal bool / int / float / str; anything else,
    a list or a config object, is never among them)."""
    if value is None:
        return None in values
    return isinstance(value, (bool, int, float, str)) and any(v is not None and value == v for v in values)


_PROCESSOR_NOTE = "HF builds {processor}; "
_REFUSED_PROCESSOR = "refused by the processor check: {why}"
_PER_POSITION = (
    "called per position with the input_ids HF's unassisted generate would hand it there, drafts and "
    "tree ancestors included (eager: such a run is not compiled)"
)
_OVER_HISTORY = (
    "applied at every level over each position's own history (the padded prompt, as HF's, drafts and tree "
    "ancestors included), inside the compiled steps"
)
_AT_LENGTH = (
    "applied at every level at each position's input_ids width as HF's counts it (the padded prompt's "
    "width plus the new tokens before), inside the compiled steps"
)
_BEAM = "beam search only (beam search is refused)"


def _processor(name: str, served: bool = True, how: str = _PER_POSITION) -> Option:
    """A field HF turns into the processor ``name``: served (``how``: the way), or refused (``how``: why)."""
    how = how if served else _REFUSED_PROCESSOR.format(why=how)
    return Option(SERVED if served else PROCESSOR, _PROCESSOR_NOTE.format(processor=name) + how)


OPTIONS: dict[str, Option] = {
    # ---- length and stopping
    "max_length": Option(SERVED, "the length budget (prompt + new tokens), filled as HF fills it"),
    "max_new_tokens": Option(SERVED, "the length budget; takes precedence over max_length, as in HF"),
    "min_length": _processor(
        "MinLengthLogitsProcessor",
        how="EOS banned at every level where a token would come too early",
    ),
    "min_new_tokens": _processor(
        "MinNewTokensLengthLogitsProcessor",
        how="EOS banned at every level where a token would come too early",
    ),
    "early_stopping": Option(NO_EFFECT, _BEAM),
    "max_time": _processor(
        "MaxTimeCriteria",
        how="checked as the target commits tokens (round granularity): the output is a prefix of the run's",
    ),
    "stop_strings": Option(
        SERVED,
        "HF's StopStringCriteria, checked on every committed token; HF drops tokenizer= and refuses "
        "stop_strings before a callable custom_generate, so pass them as hsd_fast's keywords: "
        "target.generate(custom_generate=hsd_fast.generate, stop_strings=[...], stop_tokenizer=tok), "
        "or hsd_fast.wrap(target, drafts).generate(stop_strings=[...], tokenizer=tok)",
    ),
    "eos_token_id": Option(SERVED, "a row stops at any of these ids"),
    "pad_token_id": Option(SERVED, "fills a row that stopped before the longest (EOS when unset)"),
    "bos_token_id": Option(
        NO_EFFECT, "HF uses it only to start a call without a prompt; hsd_fast needs input_ids"
    ),
    "decoder_start_token_id": Option(NO_EFFECT, "encoder-decoder models only (refused as an architecture)"),
    # ---- the decoding strategy
    "do_sample": Option(SERVED, "exact sampling (True) or the target's greedy tokens (False)"),
    "num_beam_groups": Option(REFUSED, "group (diverse) beam search is not supported", inactive=(None, 1)),
    "diversity_penalty": Option(
        REFUSED, "group (diverse) beam search is not supported", inactive=(None, 0.0)
    ),
    "constraints": Option(REFUSED, "constrained beam search is not supported"),
    "force_words_ids": Option(REFUSED, "constrained beam search is not supported"),
    "num_beams": Option(
        REFUSED,
        "beam search (num_beams > 1) is not supported: hsd_fast samples or decodes "
        "greedily, one sequence per row",
        inactive=(None, 1),
    ),
    "length_penalty": Option(NO_EFFECT, _BEAM),
    "penalty_alpha": Option(
        REFUSED, "contrastive search (penalty_alpha with top_k) is not supported", inactive=(None, 0.0)
    ),
    "dola_layers": Option(REFUSED, "DoLa decoding (contrasting early layers with the last) is not supported"),
    "guidance_scale": Option(
        REFUSED,
        "classifier-free guidance is not supported: it runs a second forward with "
        "its own K/V cache on a negative prompt",
        inactive=(None, 1.0),
    ),
    "low_memory": Option(NO_EFFECT, "HF reads it in beam and contrastive search only, both refused"),
    "num_return_sequences": Option(
        SERVED, "HF repeats each prompt before the call (sampling only); each copy is a row with its own seed"
    ),
    "token_healing": Option(
        REFUSED,
        "token healing needs tokenizer=, which HF does not keep for a callable "
        "custom_generate: heal the prompt before the call",
        inactive=(None, False),
    ),
    # ---- logits processors
    "temperature": _processor("TemperatureLogitsWarper", how="applied at every level"),
    "top_k": _processor("TopKLogitsWarper", how="applied at every level"),
    "top_p": _processor("TopPLogitsWarper", how="applied at every level"),
    "min_p": _processor("MinPLogitsWarper", how="applied at every level"),
    "typical_p": _processor("TypicalLogitsWarper", how="applied at every level"),
    "epsilon_cutoff": _processor("EpsilonLogitsWarper", how="applied at every level"),
    "eta_cutoff": _processor("EtaLogitsWarper", how="applied at every level"),
    "suppress_tokens": _processor("SuppressTokensLogitsProcessor", how="applied at every level"),
    "top_h": _processor("TopHLogitsWarper"),
    "repetition_penalty": _processor(
        "RepetitionPenaltyLogitsProcessor",
        how="applied at every level with each position's own history, drafts and tree ancestors included",
    ),
    "encoder_repetition_penalty": _processor(
        "EncoderRepetitionPenaltyLogitsProcessor",
        served=False,
        how="an encoder-decoder option (use repetition_penalty)",
    ),
    "no_repeat_ngram_size": _processor("NoRepeatNGramLogitsProcessor", how=_OVER_HISTORY),
    "encoder_no_repeat_ngram_size": _processor(
        "EncoderNoRepeatNGramLogitsProcessor",
        served=False,
        how="an encoder-decoder option (use no_repeat_ngram_size)",
    ),
    "bad_words_ids": _processor("NoBadWordsLogitsProcessor", how=_OVER_HISTORY),
    "sequence_bias": _processor("SequenceBiasLogitsProcessor", how=_OVER_HISTORY),
    "renormalize_logits": _processor("LogitNormalization", how="applied at every level"),
    "forced_bos_token_id": _processor("ForcedBOSTokenLogitsProcessor", how=_AT_LENGTH),
    "forced_eos_token_id": _processor("ForcedEOSTokenLogitsProcessor", how=_AT_LENGTH),
    "remove_invalid_values": _processor("InfNanRemoveLogitsProcessor", how="applied at every level"),
    "exponential_decay_length_penalty": _processor("ExponentialDecayLengthPenalty", how=_AT_LENGTH),
    "begin_suppress_tokens": _processor("SuppressTokensAtBeginLogitsProcessor", how=_AT_LENGTH),
    "watermarking_config": _processor("WatermarkLogitsProcessor"),
    # ---- outputs
    "output_attentions": Option(REFUSED, "hsd_fast returns no attentions", inactive=(None, False)),
    "output_hidden_states": Option(REFUSED, "hsd_fast returns no hidden states", inactive=(None, False)),
    "output_scores": Option(
        SERVED,
        "with return_dict_in_generate: the target's processed scores at every new token, from the pass "
        "that emitted it (a row past its end: a point mass on the pad id)",
    ),
    "output_logits": Option(
        SERVED,
        "with return_dict_in_generate: the target's raw logits at every new token, from the pass that "
        "emitted it (a row past its end: a point mass on the pad id)",
    ),
    "return_dict_in_generate": Option(SERVED, "a GenerateDecoderOnlyOutput holding the sequences"),
    # ---- HF's assisted generation: hsd_fast's levels take their place
    "num_assistant_tokens": Option(
        SERVED,
        "the block size of the level just under the target (its T); HF's default, 20, leaves T as "
        "given or chosen; with T= given, they must agree; without a draft, no effect (as in HF)",
    ),
    "num_assistant_tokens_schedule": Option(
        REFUSED,
        "hsd_fast's block sizes are fixed per level (T=); hsd_fast.select_hierarchy chooses them",
        inactive=(None, "constant"),
    ),
    "assistant_confidence_threshold": Option(
        REFUSED, "hsd_fast drafts whole blocks (T=), with no confidence stop", inactive=(None, 0.4)
    ),
    "prompt_lookup_num_tokens": Option(
        SERVED,
        "prompt lookup: the lookup level added at the bottom of the hierarchy with this block size (as "
        "drafts=['lookup', ...] with T=[N, ...])",
    ),
    "max_matching_ngram_size": Option(
        SERVED,
        "the lookup level's longest matched n-gram, with prompt_lookup_num_tokens (HF's default 2); "
        "alone, no effect (as in HF)",
    ),
    "assistant_early_exit": Option(
        SERVED, "the early-exit level EarlyExit(target, k): alone, or just under the target with drafts="
    ),
    "assistant_lookbehind": Option(
        REFUSED,
        "HF's lookbehind windows tune its own alignment of two tokenizers; a draft with another "
        "tokenizer (draft_tokenizers=) goes through hsd_fast's byte bridge, which takes no window",
        inactive=(None, 10),
    ),
    "target_lookbehind": Option(
        REFUSED,
        "HF's lookbehind windows tune its own alignment of two tokenizers; a draft with another "
        "tokenizer (draft_tokenizers=) goes through hsd_fast's byte bridge, which takes no window",
        inactive=(None, 10),
    ),
    "assistant_ensemble_weight": Option(
        REFUSED,
        "ensembling the assistant's distribution with the target's is "
        "not supported: hsd_fast samples the target's distribution exactly",
    ),
    "speculation_type": Option(REFUSED, "hsd_fast's speculation is its own hierarchy (drafts=, T=)"),
    "use_mtp": Option(
        REFUSED,
        "drafting with multi-token-prediction heads is not supported: give draft models in drafts=",
        inactive=(None, False),
    ),
    "is_assistant": Option(
        PROCESSOR,
        "HF builds ConfidenceCriteria for an assistant's config; refused by the stopping-criteria check",
    ),
    # ---- caches, compilation, batching: how HF runs, not what it decodes
    "use_cache": Option(NO_EFFECT, "hsd_fast always keeps its own K/V caches"),
    "cache_implementation": Option(
        REFUSED,
        "a quantized K/V cache changes the target's logits; hsd_fast keeps "
        "its own full-precision cache (other cache kinds do not change the tokens "
        "and are ignored)",
        refused_values=("quantized",),
    ),
    "cache_config": Option(NO_EFFECT, "HF's cache; hsd_fast keeps its own"),
    "max_cache_len": Option(NO_EFFECT, "HF's cache; hsd_fast keeps its own"),
    "prefill_chunk_size": Option(NO_EFFECT, "chunked prefill gives the same tokens"),
    "compile_config": Option(NO_EFFECT, "hsd_fast compiles as its compile= argument says"),
    "disable_compile": Option(NO_EFFECT, "hsd_fast compiles as its compile= argument says"),
    "continuous_batching_config": Option(NO_EFFECT, "read by HF's generate_batch only"),
    # ---- metadata
    "transformers_version": Option(NO_EFFECT, "metadata"),
    "_from_model_config": Option(NO_EFFECT, "metadata"),
}


def check_generation_options(config: Any) -> None:
    """A ValueError naming the first field of ``config`` (a ``GenerationConfig``) that ``OPTIONS``
    refuses at its value, with the reason or what to use instead."""
    for name, option in OPTIONS.items():
        value = getattr(config, name, None)
        if option.refuses(value):
            raise ValueError(f"hsd_fast does not support {name}={value!r}: {option.note.format(value=value)}")


DOC_BEGIN = (
    "<!-- options table: `python -m hsd_fast.generation_options --write docs/generation_options.md` -->"
)
DOC_END = "<!-- end of the options table -->"


def options_table() -> str:
    """Every field of this table as markdown (docs/generation_options.md): what hsd_fast does with it."""
    from hsd_fast.report import markdown_table

    rows = [[f"`{name}`", option.treatment, option.note.replace("{value}", "N").replace("|", "/")]
            for name, option in OPTIONS.items()]  # fmt: skip
    counts = {
        t: sum(o.treatment == t for o in OPTIONS.values()) for t in (SERVED, PROCESSOR, REFUSED, NO_EFFECT)
    }
    title = "Generated from `hsd_fast/generation_options.py`: " + ", ".join(
        f"{n} {t}" for t, n in counts.items()
    )
    return "\n".join([title + ".", "", *markdown_table(["field", "treatment", "what hsd_fast does"], rows)])


def main(argv: list[str] | None = None) -> int:
    import argparse
    from pathlib import Path

    from hsd_fast.report import write_marked_section

    parser = argparse.ArgumentParser(description="what hsd_fast does with each GenerationConfig field")
    parser.add_argument("--write", type=Path, help="write it between the markers of this document instead")
    args = parser.parse_args(argv)
    if args.write is None:
        print(options_table())
        return 0
    try:
        write_marked_section(args.write, DOC_BEGIN, DOC_END, options_table())
    except ValueError as err:
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
