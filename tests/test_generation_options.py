"""Every ``GenerationConfig`` field is served, refused or without effect on decoding, never ignored.

- The table (``hsd_fast.generation_options.OPTIONS``) classifies every field of the installed
  ``transformers.GenerationConfig``: a transformers release that adds a field fails here until the
  field is classified.
- Each refused field, set to a value that does something, raises a ValueError naming the field and
  its value, through the public path ``target.generate(..., custom_generate=hsd_fast.generate)``;
  each field HF turns into a logits processor or a stopping criterion that hsd_fast cannot apply is
  refused too. At their inactive values (HF's defaults) the same fields are served.
- Served fields give HF's own greedy tokens, or a sample without error.
- A bare ``GenerationConfig`` (every field None), given to ``hsd_fast.generate`` directly or through
  ``model.generate``, decodes with HF's defaults as ``model.generate`` does (it used to raise a
  TypeError comparing None with an int); a direct call builds HF's processors and criteria too.
"""

from __future__ import annotations

import pytest
import torch
from hf_models import derived_drafts
from transformers import GenerationConfig, WatermarkingConfig
from transformers.generation.logits_process import TopKLogitsWarper

import hsd_fast
from hsd_fast.generation_options import NO_EFFECT, OPTIONS, PROCESSOR, REFUSED, SERVED
from hsd_fast.request import build_request, filled_config, resolve_levels

pytestmark = pytest.mark.hf

IDS = torch.tensor([[5, 6, 7, 8]])


@pytest.fixture(scope="module")
def draft(target) -> torch.nn.Module:
    return derived_drafts(target, 1)[0]


def _hsd(target, draft, **kwargs):
    kwargs.setdefault("max_new_tokens", 4)
    return target.generate(
        IDS, custom_generate=hsd_fast.generate, drafts=[draft], T=[2], compile=False, **kwargs
    )


def _hsd_direct(target, draft, config: GenerationConfig):
    return hsd_fast.generate(target, IDS, generation_config=config, drafts=[draft], T=[2], compile=False)


# ----------------------------------------------------------------------------- the table
def test_every_generation_config_field_is_classified() -> None:
    fields = set(GenerationConfig().to_dict())
    defaults = getattr(GenerationConfig, "_get_default_generation_params", dict)()
    unclassified = sorted((fields | set(defaults)) - set(OPTIONS))
    assert not unclassified, (
        f"GenerationConfig fields hsd_fast does not classify: {unclassified}; add each to "
        "hsd_fast/generation_options.py's OPTIONS (served, processor, refused or no effect)"
    )
    assert {o.treatment for o in OPTIONS.values()} <= {SERVED, PROCESSOR, REFUSED, NO_EFFECT}
    assert all(o.note for o in OPTIONS.values())


def test_hf_defaults_are_never_refused() -> None:
    """A config as HF fills it (its global defaults, and a bare one) passes the table."""
    defaults = getattr(GenerationConfig, "_get_default_generation_params", dict)()
    config = GenerationConfig()
    for name, value in defaults.items():
        assert not OPTIONS[name].refuses(value), name
    assert not [n for n, o in OPTIONS.items() if o.refuses(getattr(config, n, None))]


# A value at which each refused field does something (HF's own validation accepts it)
REFUSED_VALUES = {
    "num_beams": 2,
    "num_beam_groups": 2,
    "diversity_penalty": 0.5,
    "constraints": [[5]],  # HF reads only whether it is set (Constraint classes left transformers 5.24)
    "force_words_ids": [[5]],
    "penalty_alpha": 0.6,
    "dola_layers": "high",
    "guidance_scale": 1.5,
    "token_healing": True,
    "output_attentions": True,
    "output_hidden_states": True,
    "num_assistant_tokens_schedule": "heuristic",
    "assistant_confidence_threshold": 0.2,
    "assistant_lookbehind": 3,
    "target_lookbehind": 3,
    "assistant_ensemble_weight": 0.5,
    "speculation_type": "dflash",
    "use_mtp": True,
    "cache_implementation": "quantized",
}
# Refused by HF itself before it calls a custom_generate callable: checked on a direct call
HF_REFUSES_FIRST = {"token_healing", "cache_implementation"}
# What makes the field mean something to HF (beam groups need beams; outputs need a dict)
COMPANIONS = {
    "num_beam_groups": {"num_beams": 2},
    "penalty_alpha": {"top_k": 4},
    **{f: {"return_dict_in_generate": True} for f in ("output_attentions", "output_hidden_states")},
}


def test_every_refused_field_is_tested() -> None:
    assert sorted(REFUSED_VALUES) == sorted(n for n, o in OPTIONS.items() if o.treatment == REFUSED)


@pytest.mark.parametrize("field", sorted(REFUSED_VALUES))
def test_a_refused_field_raises_naming_it(target, draft, field) -> None:
    value = REFUSED_VALUES[field]
    kwargs = {field: value, **COMPANIONS.get(field, {})}
    with pytest.raises(ValueError, match=rf"\b{field}=") as caught:
        if field in HF_REFUSES_FIRST:
            _hsd_direct(target, draft, GenerationConfig(max_new_tokens=4, **kwargs))
        else:
            _hsd(target, draft, **kwargs)
    assert repr(value) in str(caught.value) and OPTIONS[field].note.split(" ")[0] in str(caught.value)


def test_refusals_say_what_to_use_instead(target, draft) -> None:
    with pytest.raises(ValueError, match=r"hsd_fast.select_hierarchy chooses them"):
        _hsd(target, draft, num_assistant_tokens_schedule="heuristic")


# A value at which HF builds the processor or criterion each field names
PROCESSOR_VALUES = {
    "encoder_repetition_penalty": 1.2,
    "encoder_no_repeat_ngram_size": 2,
    "is_assistant": True,
}
# ...and the processor fields served, inside the steps or per position (tests/test_logits_processors.py)
SERVED_PROCESSOR_VALUES = {
    "top_h": 0.5,
    "no_repeat_ngram_size": 2,
    "bad_words_ids": [[5]],
    "sequence_bias": {(5,): 1.0},
    "forced_bos_token_id": 3,
    "forced_eos_token_id": 2,
    "exponential_decay_length_penalty": (2, 1.5),
    "begin_suppress_tokens": [3],
    "watermarking_config": "watermark",  # built in the test
    "renormalize_logits": True,
    "remove_invalid_values": True,
}


def test_every_processor_field_is_tested() -> None:
    assert sorted(PROCESSOR_VALUES) == sorted(n for n, o in OPTIONS.items() if o.treatment == PROCESSOR)
    assert all(OPTIONS[n].treatment == SERVED for n in SERVED_PROCESSOR_VALUES)


@pytest.mark.parametrize("field", sorted(SERVED_PROCESSOR_VALUES))
def test_a_served_processor_field_gives_hfs_greedy_tokens(target, draft, field) -> None:
    value = SERVED_PROCESSOR_VALUES[field]
    if field == "watermarking_config":
        value = WatermarkingConfig()
    kwargs = {"do_sample": False, "max_new_tokens": 8, field: value}
    assert _hsd(target, draft, **kwargs).tolist() == target.generate(IDS, **kwargs).tolist()


@pytest.mark.parametrize("field", sorted(PROCESSOR_VALUES))
def test_a_processor_field_hsd_cannot_apply_is_refused(target, draft, field) -> None:
    """Refused by the processor or criteria check, naming the class the table's note names; on a
    direct call, where HF prepared nothing, too."""
    value = PROCESSOR_VALUES[field]
    if field == "watermarking_config":
        value = WatermarkingConfig()
    note = OPTIONS[field].note
    named = note.split("HF builds ")[1].split(" ")[0].rstrip(";") if "HF builds " in note else ""
    for call in (
        lambda: _hsd(target, draft, do_sample=True, **{field: value}),
        lambda: _hsd_direct(
            target, draft, GenerationConfig(max_new_tokens=4, do_sample=True, **{field: value})
        ),
    ):
        with pytest.raises(ValueError, match=named or None):
            call()


# ----------------------------------------------------------------------------- served
INACTIVE = [
    {"num_beams": 1},
    {"num_assistant_tokens": 20},
    {"num_assistant_tokens_schedule": "constant"},
    {"guidance_scale": 1},
    {"penalty_alpha": 0.0},
    {"output_scores": False},
    {"low_memory": True},
    {"cache_implementation": "static"},
    {"use_cache": False},
    {"length_penalty": 2.0},
    {"diversity_penalty": 0.0},
]


@pytest.mark.parametrize("option", INACTIVE, ids=lambda o: next(iter(o)))
def test_inactive_or_harmless_values_are_served_exactly(target, draft, option) -> None:
    kwargs = {"do_sample": False, "max_new_tokens": 6, **option}
    hf = target.generate(IDS, do_sample=False, max_new_tokens=6)
    assert _hsd(target, draft, **kwargs).tolist() == hf.tolist()


def test_served_fields_give_hfs_greedy_tokens(target, draft) -> None:
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    for kwargs in (
        {"max_new_tokens": 7, "eos_token_id": [2, 7], "pad_token_id": 0},
        {"max_length": 9, "eos_token_id": None, "pad_token_id": 1, "bos_token_id": 1},
        {"max_new_tokens": 5, "return_dict_in_generate": True, "suppress_tokens": [3, 4]},
    ):
        kwargs |= {"attention_mask": mask, "do_sample": False}
        hf = target.generate(ids, **kwargs)
        out = target.generate(
            ids, custom_generate=hsd_fast.generate, drafts=[draft], T=[2], compile=False, **kwargs
        )
        if kwargs.get("return_dict_in_generate"):
            hf, out = hf.sequences, out.sequences
        assert out.tolist() == hf.tolist(), kwargs


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0.7, "top_k": 10},
        {"top_p": 0.8},
        {"min_p": 0.1},
        {"typical_p": 0.9},
        {"epsilon_cutoff": 1e-3},
        {"eta_cutoff": 1e-3},
        {"suppress_tokens": [3, 4]},
        {"repetition_penalty": 1.3},  # tests/test_repetition_penalty.py: exact, greedy and sampled
        {"min_new_tokens": 4},  # tests/test_min_length.py: exact, greedy and sampled
        {"min_length": 12},
    ],
    ids=lambda s: ",".join(s),
)
def test_served_sampling_fields_sample(target, draft, sampling) -> None:
    out = _hsd(target, draft, do_sample=True, seed=7, max_new_tokens=6, **sampling)
    new = out[:, IDS.shape[1] :]
    assert new.shape[1] <= 6 and ((new >= 0) & (new < 96)).all()
    if "suppress_tokens" in sampling:
        assert not torch.isin(new, torch.tensor(sampling["suppress_tokens"])).any()


def test_stopping_fields_are_served(target, draft) -> None:
    """max_time and stop_strings (hsd_fast's keyword, with stop_tokenizer=): HF's tokens
    (tests/test_stopping.py covers them in depth). A stop_strings HF sees in the config meets HF's
    own refusal before custom_generate runs: it drops tokenizer=."""
    from hsd_fast import zoo

    tokenizer = zoo.load_tokenizer()
    hf = target.generate(IDS, do_sample=False, max_new_tokens=6, max_time=30.0)
    assert _hsd(target, draft, do_sample=False, max_new_tokens=6, max_time=30.0).tolist() == hf.tolist()
    text = tokenizer.decode(hf[0, 5:7])
    hf = target.generate(IDS, do_sample=False, max_new_tokens=6, stop_strings=[text], tokenizer=tokenizer)
    out = _hsd(
        target, draft, do_sample=False, max_new_tokens=6, stop_strings=[text], stop_tokenizer=tokenizer
    )
    assert out.tolist() == hf.tolist()
    with pytest.raises(ValueError, match="tokenizer"):
        _hsd(target, draft, generation_config=GenerationConfig(stop_strings=[text]), tokenizer=tokenizer)


def test_num_return_sequences_samples_each_copy(target, draft) -> None:
    out = _hsd(target, draft, do_sample=True, num_return_sequences=3, seed=11, max_new_tokens=8)
    assert out.shape[0] == 3 and (out[:, : IDS.shape[1]] == IDS).all()


# ----------------------------------------------------------------------------- a bare config
def test_a_bare_config_decodes_with_hfs_defaults(target, draft) -> None:
    """``GenerationConfig()`` (every field None) used to raise TypeError ('>' between None and int)
    on a direct call. Now every spelling decodes as ``model.generate(ids)`` with HF's defaults: the
    model's generation config (EOS, pad), then 20 new tokens, greedy."""
    hf = target.generate(IDS).tolist()
    assert hf == target.generate(IDS, generation_config=GenerationConfig()).tolist()
    bare = GenerationConfig()
    levels = {"drafts": [draft], "T": [2], "compile": False}
    assert hsd_fast.generate(target, IDS, generation_config=bare, **levels).tolist() == hf
    assert hsd_fast.generate(target, IDS, **levels).tolist() == hf  # no config at all
    assert (
        target.generate(IDS, custom_generate=hsd_fast.generate, generation_config=bare, **levels).tolist()
        == hf
    )
    assert bare.to_dict() == GenerationConfig().to_dict()  # the caller's config is left as it was
    short = GenerationConfig(max_new_tokens=3)
    assert hsd_fast.generate(target, IDS, generation_config=short, **levels).tolist() == [
        hf[0][: IDS.shape[1] + 3]
    ]


def test_a_direct_call_builds_hfs_processors(target) -> None:
    """Called directly, with no processors prepared, sampling gets HF's default top-k of 50 as
    ``model.generate`` would apply it (not plain sampling)."""
    request = build_request(
        target, IDS, resolve_levels(), generation_config=GenerationConfig(do_sample=True, max_new_tokens=2)
    )
    assert [type(p) for p in request.transform.processors] == [TopKLogitsWarper]
    assert request.transform.processors[0].top_k == 50 and not request.greedy and request.max_new_tokens == 2


def test_a_config_hf_prepared_is_used_as_is(target, draft) -> None:
    """On the public path HF has filled the config already: it is taken as it is (no copy, no
    change), so the drop-in path decodes exactly what HF prepared."""
    seen = []

    def capture(
        model, input_ids, logits_processor=None, stopping_criteria=None, generation_config=None, **kw
    ):
        seen.append(filled_config(model, generation_config, input_ids.shape[1]) is generation_config)
        return input_ids

    for kwargs in ({}, {"max_new_tokens": 3, "do_sample": True}, {"generation_config": GenerationConfig()}):
        target.generate(IDS, custom_generate=capture, **kwargs)
    assert seen == [True, True, True]


def test_docs_generation_options_shows_the_table() -> None:
    """docs/generation_options.md is ``python -m hsd_fast.generation_options`` run on this code."""
    from pathlib import Path

    from hsd_fast.generation_options import DOC_BEGIN, DOC_END, options_table
    from hsd_fast.report import marked_section

    text = (Path(__file__).parents[1] / "docs" / "generation_options.md").read_text()
    table = marked_section(text, DOC_BEGIN, DOC_END)
    assert table is not None, "docs/generation_options.md lost its markers"
    regenerate = "regenerate it: python -m hsd_fast.generation_options --write docs/generation_options.md"
    assert table == options_table(), regenerate
