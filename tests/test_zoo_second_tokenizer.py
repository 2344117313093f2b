"""The zoo's second tokenizer: `xs4k` and `xxs4k`, drafts in `xs`'s and `xxs`'s shapes over a byte-level
BPE of 4096 entries of its own (`zoo/tokenizer_4096`), load with that tokenizer by name, stay out of
the family and continue code; the shared tokenizer (8192 entries) stays the default for every other
name."""

import json
from pathlib import Path

import pytest
import torch

from hsd_fast import zoo
from hsd_fast.zoo.build import (
    CPU_STEPS,
    LEARNING_RATES,
    OWN_TOKENIZER,
    SHAPE_OF,
    _training_record,
    read_manifest,
)
from hsd_fast.zoo.train import TrainConfig

pytestmark = pytest.mark.hf

REPO_ZOO = Path(__file__).resolve().parents[1] / "zoo"

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "In the beginning God created the heaven and the earth.",
    "=head1 NAME\n\nperlfunc - Perl builtin functions, naïve café ✓",
    "class Reader:\n    def __init__(self, path):\n        self.path = path\n",
]
CODE = "import os\n\n\ndef read_config(path):\n    "


@pytest.fixture(scope="module")
def tokenizer():
    return zoo.load_tokenizer("xs4k")


@pytest.fixture(scope="module")
def shared():
    return zoo.load_tokenizer()


@pytest.fixture(scope="module")
def model():
    return zoo.load("xs4k")


def test_its_tokenizer_has_4096_entries_and_round_trips_text(tokenizer, shared) -> None:
    assert len(tokenizer) == 4096 and len(shared) == 8192
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == tokenizer.bos_token_id == 0
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text
        assert max(ids) < 4096
    # another vocabulary: the same text splits into more tokens than the shared tokenizer makes
    mine = [tokenizer(t)["input_ids"] for t in TEXTS]
    theirs = [shared(t)["input_ids"] for t in TEXTS]
    assert mine != theirs and sum(map(len, mine)) > sum(map(len, theirs))
    assert tokenizer.get_vocab() != shared.get_vocab()


def test_the_manifest_describes_its_tokenizer(tokenizer, shared) -> None:
    manifest = read_manifest(REPO_ZOO)
    directory = manifest["models"]["xs4k"]["tokenizer"]
    assert directory == OWN_TOKENIZER["xs4k"] == "tokenizer_4096"
    assert (REPO_ZOO / directory / "tokenizer.json").is_file()
    record = manifest["tokenizers"][directory]
    assert record["vocab_size"] == len(tokenizer) and record["eos_id"] == 0
    # the card's claim: its first ids name the same entries as the shared tokenizer's, the rest do not
    same = record["same_ids_as_shared"]
    ids = list(range(len(tokenizer)))
    assert tokenizer.convert_ids_to_tokens(ids[:same]) == shared.convert_ids_to_tokens(ids[:same])
    if same < len(tokenizer):
        assert tokenizer.convert_ids_to_tokens(same) != shared.convert_ids_to_tokens(same)
    assert set(record["sources"]) == set(manifest["corpus"]["sources"])
    assert "## xs4k" in (REPO_ZOO / "README.md").read_text()
    assert "## xxs4k" in (REPO_ZOO / "README.md").read_text()
    assert manifest["models"]["xxs4k"]["tokenizer"] == directory


def test_load_tokenizer_by_model_name() -> None:
    for name in zoo.names(variants=True):
        assert len(zoo.load_tokenizer(name)) == (4096 if name in OWN_TOKENIZER else 8192), name
    with pytest.raises(ValueError, match="no zoo model 'giant'"):
        zoo.load_tokenizer("giant")


def test_it_stays_out_of_the_family() -> None:
    """Code that builds hierarchies from `zoo.names()` never meets a draft with another vocabulary."""
    for name in ("xxs4k", "xs4k"):
        assert name not in zoo.names() and name in zoo.names(variants=True)
        assert not zoo.in_family(read_manifest(REPO_ZOO)["models"][name])
    assert zoo.names()[-1] == "s"
    assert zoo.in_family(read_manifest(REPO_ZOO)["models"]["s"])


@pytest.mark.parametrize("name", ["xxs4k", "xs4k"])
def test_the_model_matches_its_tokenizer_and_record(name, tokenizer) -> None:
    model = zoo.load(name)
    assert model.config.vocab_size == len(tokenizer) == 4096
    fields = ("hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "intermediate_size")
    shape = json.loads((zoo.zoo_dir() / SHAPE_OF[name] / "config.json").read_text())
    assert tuple(model.get_input_embeddings().weight.shape) == (4096, shape["hidden_size"])
    assert model.config.eos_token_id == model.config.pad_token_id == tokenizer.eos_token_id
    assert [getattr(model.config, f) for f in fields] == [shape[f] for f in fields]
    record = read_manifest(REPO_ZOO)["models"][name]
    assert record["params"] == sum(p.numel() for p in model.parameters())
    assert record["grown_from"] is None and "variant_of" not in record  # from scratch
    config = TrainConfig(name, CPU_STEPS[name], lr=LEARNING_RATES[name])
    assert record["steps"] == CPU_STEPS[name]
    assert record["training"] == json.loads(json.dumps(_training_record(config, "cpu")))


def test_it_continues_code(model, tokenizer) -> None:
    ids = tokenizer(CODE, return_tensors="pt")["input_ids"]
    out = model.generate(ids, do_sample=False, max_new_tokens=24, eos_token_id=None)
    assert out.shape == (1, ids.shape[1] + 24)
    text = tokenizer.decode(out[0, ids.shape[1] :])
    assert text.strip() and text.isascii(), text
    # trained, not random: its loss on a code snippet is far below log(4096) = 8.3
    code = tokenizer("\n".join(TEXTS[i] for i in (0, 3)) * 2, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(code).logits[0, :-1]
    assert torch.nn.functional.cross_entropy(logits, code[0, 1:]) < 5.0
