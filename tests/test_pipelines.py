"""HF pipelines: ``pipeline("text-generation", model=target, custom_generate=hsd_fast.generate,
drafts=[...])`` decodes with HSD on every call (the keywords become the pipeline's generate defaults),
per-call keywords do the same, and a ``hsd_fast.wrap`` model serves as the pipeline's model; the text
always equals the plain pipeline's greedy text, batched prompts included."""

import pytest
from transformers import pipeline

import hsd_fast
import hsd_fast.hf_generate
from hsd_fast import zoo

pytestmark = pytest.mark.hf

PROMPTS = ["def read_config(path):", "import os\nimport sys\n\n\nclass"]
GREEDY = {"max_new_tokens": 16, "do_sample": False}


@pytest.fixture(scope="module")
def zoo_pair():
    return zoo.load_tokenizer(), zoo.load("xs"), zoo.load("xxs")


@pytest.fixture
def hsd_runs(monkeypatch) -> list[int]:
    """How many requests went through HSD's engine (one per ``generate`` call)."""
    runs: list[int] = []
    run_hsd = hsd_fast.hf_generate.run_hsd

    def counted(*args, **kwargs):
        runs.append(1)
        return run_hsd(*args, **kwargs)

    monkeypatch.setattr(hsd_fast.hf_generate, "run_hsd", counted)
    return runs


def _texts(outputs) -> list[str]:
    return [out[0]["generated_text"] for out in outputs]


def test_pipeline_defaults_decode_with_hsd(zoo_pair, hsd_runs) -> None:
    tokenizer, target, draft = zoo_pair
    expected = _texts(pipeline("text-generation", model=target, tokenizer=tokenizer)(PROMPTS, **GREEDY))
    assert not hsd_runs
    pipe = pipeline(
        "text-generation", model=target, tokenizer=tokenizer, custom_generate=hsd_fast.generate,
        drafts=["lookup", draft],
    )  # fmt: skip
    assert _texts(pipe(PROMPTS, **GREEDY)) == expected
    assert len(hsd_runs) == len(PROMPTS)
    assert _texts(pipe(PROMPTS, batch_size=2, **GREEDY)) == expected  # one left-padded batch
    assert len(hsd_runs) == len(PROMPTS) + 1


def test_pipeline_call_keywords_decode_with_hsd(zoo_pair, hsd_runs) -> None:
    tokenizer, target, draft = zoo_pair
    pipe = pipeline("text-generation", model=target, tokenizer=tokenizer)
    expected = pipe(PROMPTS[0], **GREEDY)
    assert pipe(PROMPTS[0], custom_generate=hsd_fast.generate, drafts=[draft], T=[3], **GREEDY) == expected
    assert len(hsd_runs) == 1


def test_a_wrapped_model_serves_a_pipeline(zoo_pair, hsd_runs) -> None:
    tokenizer, target, draft = zoo_pair
    expected = pipeline("text-generation", model=target, tokenizer=tokenizer)(PROMPTS[1], **GREEDY)
    wrapped = hsd_fast.wrap(target, [draft])
    assert pipeline("text-generation", model=wrapped, tokenizer=tokenizer)(PROMPTS[1], **GREEDY) == expected
    assert len(hsd_runs) == 1
