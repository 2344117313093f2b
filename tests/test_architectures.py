"""The architecture rule against the installed transformers
(docs/design.md, "The conformance suite, doctor and the support table").

One parametrised test over every causal LM family transformers registers: a family the rule admits
must decode exactly (greedy HSD == the model's own greedy at batch 1 and in a left-padded batch of 3
where an EOS stops one row mid-way, with two drafts of the family) and finish a sampled run with
``num_return_sequences``; a family the rule refuses is skipped with its reason, so the refused ones
and why are listed in the test summary (``-ra``). The list comes from transformers: a new release is
covered without edits here (a new family whose tiny config cannot be built fails, naming it, and so
does an admitted family that its own load-time checks refuse: the rule must decide from the class
and config)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from arch_configs import PAD, VOCAB, WINDOW, family_drafts, tiny_config, tiny_model
from hf_models import left_padded
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import hsd_fast
from hsd_fast.architectures import FULL, SLIDING, readme_table, refusal, support_table
from hsd_fast.compat import check_model
from hsd_fast.hf_runner import HFRunner
from hsd_fast.stats import HSDStats

pytestmark = pytest.mark.hf

PROMPTS = [[5, 9, 11, 40, 3, 7, 12, 60, 33], [8, 9, 10, 11], [70, 71, 3, 4, 5, 6]]  # lengths 9, 4, 6
NEW = 12
assert min(map(len, PROMPTS)) + NEW > WINDOW  # every sequence outgrows the sliding window


def _families() -> list[tuple[str, str]]:
    """(model type, class name) per registered causal LM, once per pair of config and model class
    (``gpt-sw3`` is GPT-2 again)."""
    seen, out = set(), []
    for model_type, class_name in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()):
        key = (CONFIG_MAPPING[model_type].__name__, class_name)
        if key not in seen:
            seen.add(key)
            out.append((model_type, class_name))
    return out


def _verdict(model_type: str, class_name: str) -> str | None:
    """The rule on the family's tiny config; where none can be built, on its default config (a
    refused family needs no tiny config; an admitted one does, so that case fails)."""
    try:
        model_cls = getattr(transformers, class_name)
    except ImportError as err:  # an optional dependency of the family (PIL, timm, ...) is missing
        pytest.skip(
            f"{model_type} ({class_name}) cannot be imported here: {str(err).strip().splitlines()[0]}"
        )
    try:
        config = tiny_config(model_type)
    except Exception as err:
        try:
            reason = refusal(model_cls, CONFIG_MAPPING[model_type]())
        except Exception:  # not even its default config can be built with this transformers
            first_line = str(err).splitlines()[0]
            pytest.skip(
                f"{model_type} ({class_name}) cannot be checked here: no config builds ({first_line})"
            )
        if reason is None:
            raise AssertionError(f"{model_type}: admitted, but no tiny config: add an override") from err
        return reason
    return refusal(model_cls, config)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: a second intra-op thread only adds synchronisation (on a loaded machine, a lot)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(("model_type", "class_name"), _families(), ids=[t for t, _ in _families()])
def test_family(model_type: str, class_name: str) -> None:
    reason = _verdict(model_type, class_name)
    if reason is not None:
        pytest.skip(f"{model_type} ({class_name}) refused: {reason}")
    target = tiny_model(model_type)
    try:  # the loaded model's own checks (the probe forward): the rule admitted it, so they must pass
        check_model(target, "target")
        HFRunner(target, VOCAB).prepare(1, 2)
    except ValueError as err:
        pytest.fail(f"{model_type} ({class_name}) is admitted by the rule but refused when loaded: {err}")
    drafts = family_drafts(target)
    hsd = {"custom_generate": hsd_fast.generate, "drafts": drafts, "T": [2, 2], "compile": False}
    greedy = {"do_sample": False, "max_new_tokens": NEW, "pad_token_id": PAD}

    ids = torch.tensor([PROMPTS[0]])
    expected = target.generate(ids, eos_token_id=None, **greedy)
    alone = target.generate(ids, eos_token_id=None, output_hsd_stats=True, **greedy, **hsd)
    assert alone.sequences.tolist() == expected.tolist(), "batch 1"

    ids, mask = left_padded(PROMPTS, PAD)
    free = target.generate(ids, attention_mask=mask, eos_token_id=None, **greedy)
    eos = int(free[1, ids.shape[1] + NEW // 2])  # row 1 stops mid-way at this token (or earlier)
    expected = target.generate(ids, attention_mask=mask, eos_token_id=eos, **greedy)
    batch = target.generate(
        ids, attention_mask=mask, eos_token_id=eos, output_hsd_stats=True, **greedy, **hsd
    )
    assert batch.sequences.tolist() == expected.tolist(), "left-padded batch of 3 with an EOS"
    row = expected[1, ids.shape[1] :].tolist()
    # row 1 ends at its first EOS (at or before NEW // 2) and pads from there to the batch's end
    stop = row.index(eos)
    assert stop <= NEW // 2 and row[stop + 1 :] == [PAD] * (len(row) - 1 - stop), row
    stats: HSDStats = alone.hsd_stats + batch.hsd_stats
    assert stats.accepted[2] > 0 and sum(stats.corrections) > 0, stats.summary()  # accepts and rollbacks

    sampled = target.generate(
        torch.tensor([PROMPTS[1]]), do_sample=True, num_return_sequences=2, max_new_tokens=NEW,
        eos_token_id=None, **hsd,
    )  # fmt: skip
    assert sampled.shape == (2, len(PROMPTS[1]) + NEW)
    assert ((sampled >= 0) & (sampled < VOCAB)).all()


def test_the_suite_covers_sliding_and_hybrid_families() -> None:
    """The tiny configs really exercise windows: the sliding-window families slide, and the hybrid
    ones mix both layer kinds (one mask per layer type); Moshi's config has a window its code never
    applies, so its layers stay full."""
    expected = {
        "mistral": {SLIDING: WINDOW},
        "qwen3": {FULL: None, SLIDING: WINDOW},
        "gemma3_text": {FULL: None, SLIDING: WINDOW},
        "cohere2": {FULL: None, SLIDING: WINDOW},
        "gemma2": {FULL: None, SLIDING: WINDOW},
        "moshi": {FULL: None},
    }
    for model_type, windows in expected.items():
        if model_type in CONFIG_MAPPING:
            assert HFRunner(tiny_model(model_type), VOCAB).windows == windows, model_type


def test_docs_support_shows_the_generated_support_table() -> None:
    """docs/support.md's table is ``python -m hsd_fast.architectures`` run on the transformers it names
    (on another version the registry differs: nothing to compare)."""
    table = readme_table((Path(__file__).parents[1] / "docs" / "support.md").read_text())
    assert table is not None, "docs/support.md lost its support-table markers"
    if f"on transformers {transformers.__version__}:" not in table.splitlines()[0]:
        pytest.skip(f"support table generated on another transformers ({table.splitlines()[0]})")
    regenerate = "regenerate it: python -m hsd_fast.architectures --readme docs/support.md"
    assert table == support_table(), regenerate
