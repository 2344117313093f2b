"""The committed zoo loads, round-trips text and generates; greedy HSD over it equals the target's own
greedy output; the corpus split, the token file and the trainer behave."""

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import hsd_fast
from hsd_fast import zoo
from hsd_fast.zoo import card
from hsd_fast.zoo.corpus import Document, TokenCorpus, python_code, tokenize, validation_ids
from hsd_fast.zoo.models import SIZES, load_int8, new_model, save_int8
from hsd_fast.zoo.train import TrainConfig, train

pytestmark = pytest.mark.hf

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "In the beginning God created the heaven and the earth.",
    "=head1 NAME\n\nperlfunc - Perl builtin functions, naïve café ✓",
]


@pytest.fixture(scope="module")
def tokenizer():
    return zoo.load_tokenizer()


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return {name: zoo.load(name) for name in zoo.names()}


def test_zoo_is_a_family_of_four_or_more_sizes_spanning_10x() -> None:
    manifest = zoo.manifest()
    params = [manifest["models"][n]["params"] for n in zoo.names()]
    assert len(params) >= 4 and params == sorted(params)
    assert params[-1] / params[0] >= 10
    stored = sum(p.stat().st_size for p in zoo.zoo_dir().rglob("*") if p.is_file())
    assert stored <= 30 * 2**20


def test_card_matches_manifest() -> None:
    assert (zoo.zoo_dir() / "README.md").read_text() == card.render(zoo.manifest())


def test_tokenizer_round_trips_text(tokenizer) -> None:
    assert len(tokenizer) == zoo.manifest()["tokenizer"]["vocab_size"]
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text
        assert max(ids) < len(tokenizer)
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 0


def test_every_model_generates(models, tokenizer) -> None:
    ids = tokenizer(TEXTS[0], return_tensors="pt")["input_ids"]
    for name, model in models.items():
        assert model.config.vocab_size == len(tokenizer), name
        out = model.generate(ids, do_sample=False, max_new_tokens=12, eos_token_id=None)
        assert out.shape == (1, ids.shape[1] + 12)
        # trained, not random: the held-out loss recorded for it is far below log(V) = 9.0
        assert max(zoo.manifest()["models"][name]["val_loss"].values()) < 7.5


def test_greedy_hsd_over_the_zoo_equals_the_targets_greedy(models, tokenizer) -> None:
    names = zoo.names()
    target, drafts = models[names[-1]], [models[n] for n in names[:-1]]
    for text in TEXTS[:2]:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        expected = target.generate(ids, do_sample=False, max_new_tokens=48, eos_token_id=None)
        out = target.generate(
            ids,
            custom_generate=hsd_fast.generate,
            drafts=drafts,
            T=[3] * len(drafts),
            do_sample=False,
            max_new_tokens=48,
            eos_token_id=None,
            output_hsd_stats=True,
        )
        assert out.sequences.tolist() == expected.tolist()
        stats = out.hsd_stats
        assert 0 < stats.accepted[-1] < stats.verified[-1]  # the target accepted and rejected drafts


def test_int8_storage_round_trip(tmp_path: Path) -> None:
    model = new_model(SIZES["xxs"], vocab_size=300, seed=3).eval()
    save_int8(model, tmp_path)
    stored = load_int8(tmp_path)
    ids = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = model(ids).logits, stored(ids).logits
    assert (a - b).abs().max() < 0.05  # int8 rows: ~1/254 of each row's largest weight
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.95
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["tie_word_embeddings"] and stored.lm_head.weight is stored.model.embed_tokens.weight
    with pytest.raises(FileNotFoundError, match="no zoo model"):
        load_int8(tmp_path / "missing")


def test_load_refuses_unknown_names() -> None:
    with pytest.raises(ValueError, match="no zoo model 'giant'"):
        zoo.load("giant")


def _slice(tokenizer, count: int = 6) -> TokenCorpus:
    docs = [Document("python-code", rel, text) for rel, text in itertools.islice(python_code(), count)]
    docs += [Document("prose", f"t{i}", TEXTS[1] * 40) for i in range(2)]
    encode = tokenizer.backend_tokenizer.encode_batch
    return tokenize(docs, lambda texts: [e.ids for e in encode(texts)], tokenizer.eos_token_id)


def test_split_is_by_document_and_every_source_has_validation() -> None:
    docs = [Document(s, f"{s}/{i}", "x") for s in ("a", "b") for i in range(200)]
    held = validation_ids(docs)
    assert held == validation_ids(list(reversed(docs)))  # independent of order
    assert {s for s, _ in held} == {"a", "b"}
    assert 2 <= len(held) <= 30


def test_token_corpus_hash_round_trip(tokenizer, tmp_path: Path) -> None:
    corpus = _slice(tokenizer, 3)
    assert set(corpus.val) == {"python-code", "prose"} and all(v.size for v in corpus.val.values())
    digest = corpus.save(tmp_path / "tokens.npz")
    assert TokenCorpus.load(tmp_path / "tokens.npz", expected_hash=digest).hash() == digest
    with pytest.raises(ValueError, match="holds another corpus"):
        TokenCorpus.load(tmp_path / "tokens.npz", expected_hash="0" * 64)
    assert all(np.all(v < len(tokenizer)) for v in corpus.train.values())


def test_trainer_loss_falls(tokenizer, tmp_path: Path) -> None:
    corpus = _slice(tokenizer)
    config = TrainConfig("xxs", steps=40, batch_size=4, seq_len=64, lr=3e-3, warmup=5, eval_every=40)
    _, records = train(corpus, config, len(tokenizer), log_path=tmp_path / "log.jsonl", progress=False)
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 40
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0
    assert records[-1]["tokens"] == 40 * 4 * 64 and set(records[-1]["val"]) == {"python-code", "prose"}
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == len(records)
