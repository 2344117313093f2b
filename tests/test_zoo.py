"""The committed zoo loads, round-trips text and generates; greedy HSD over it equals the target's own
greedy output; the corpus split, the token file and the trainer behave; the build finds its sources,
regenerates the calibration windows, and the package ships exactly what loading reads."""

import argparse
import copy
import dataclasses
import fnmatch
import glob
import hashlib
import itertools
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from printed import words
from safetensors.torch import load_file

import hsd_fast
from hsd_fast import zoo
from hsd_fast.cli import main
from hsd_fast.zoo import card, corpus
from hsd_fast.zoo.build import (
    CPU_STEPS,
    DEFAULT_SIZES,
    EXIT_STRIDE,
    EXIT_WEIGHTS,
    LEARNING_RATES,
    _training_record,
    calibration_record,
    read_manifest,
    tokenize_with,
    write_calibration,
)
from hsd_fast.zoo.calibration import read_calibration
from hsd_fast.zoo.commands import add_parser
from hsd_fast.zoo.corpus import (
    Document,
    MissingSourcesError,
    TokenCorpus,
    documents,
    locate_sources,
    python_code,
    text_hash,
    validation_ids,
)
from hsd_fast.zoo.models import SIZES, load_int8, new_model, save_int8
from hsd_fast.zoo.train import (
    TrainConfig,
    config_record,
    exit_logits,
    exit_loss,
    exit_losses,
    linear_exit_weights,
    lm_loss,
    train,
)

pytestmark = pytest.mark.hf

REPO = Path(__file__).resolve().parents[1]
REPO_ZOO = REPO / "zoo"  # the committed files (`zoo.zoo_dir()` may be an installed copy or $HSD_FAST_ZOO)

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


def test_zoo_is_a_family_of_four_or_more_sizes_spanning_10x(models) -> None:
    params = [sum(p.numel() for p in models[n].parameters()) for n in zoo.names()]  # as loaded
    assert params == [zoo.manifest()["models"][n]["params"] for n in zoo.names()]  # the card is right
    assert len(params) >= 4 and params == sorted(params)
    assert params[-1] / params[0] >= 10
    stored = sum(p.stat().st_size for p in zoo.zoo_dir().rglob("*") if p.is_file())
    assert stored <= 30 * 2**20


def test_card_matches_manifest() -> None:
    # the repository's card: it is not installed (`zoo info` renders it from the manifest)
    assert (REPO_ZOO / "README.md").read_text() == card.render(read_manifest(REPO_ZOO))


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
        # trained, not random: its loss on the held-out calibration windows is far below log(V) = 9.0
        for source, windows in read_calibration(zoo.zoo_dir()).items():
            with torch.no_grad():
                logits = model(windows[:2]).logits[:, :-1]
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:2, 1:].flatten())
            assert loss < 7.5, (name, source, float(loss))


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
    return tokenize_with(docs, tokenizer)


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


def test_exit_loss_weighs_every_layers_exit() -> None:
    model = new_model(SIZES["xs"], vocab_size=300, seed=1)  # 4 layers
    batch = torch.randint(0, 300, (2, 17), generator=torch.Generator().manual_seed(0))
    weights = linear_exit_weights(4, final=0.4)
    assert weights[-1] == 0.4 and weights == tuple(sorted(weights)) and abs(sum(weights) - 1) < 1e-9
    loss = exit_loss(model, batch, weights)
    assert torch.isfinite(loss) and loss.requires_grad
    with torch.no_grad():
        # only the last layer weighted: the plain LM loss
        assert torch.allclose(exit_loss(model, batch, (0, 0, 0, 1.0)), lm_loss(model, batch), atol=1e-6)
        # exit k: the model cut after k layers, with the same final norm and head
        cut = copy.deepcopy(model)
        cut.model.layers = cut.model.layers[:2]
        cut.config.num_hidden_layers = 2
        assert torch.allclose(exit_logits(model, batch, [2])[0], cut(batch).logits, atol=1e-5)
        losses = exit_losses(model, batch, [1, 2, 3, 4])
        assert torch.allclose(loss, sum(w * x for w, x in zip(weights, losses, strict=True)), atol=1e-6)


def test_exit_stride_scores_the_early_exits_on_every_strideth_position() -> None:
    """Over the ``stride`` offsets the strided loss averages to the full one (the last layer is
    scored everywhere at each), one offset is not it, and the gradient reaches every layer."""
    model = new_model(SIZES["xs"], vocab_size=300, seed=1)  # 4 layers
    batch = torch.randint(0, 300, (2, 17), generator=torch.Generator().manual_seed(0))  # 16 positions
    weights = linear_exit_weights(4, final=0.4)
    with torch.no_grad():
        full = exit_loss(model, batch, weights)
        strided = [exit_loss(model, batch, weights, stride=4, offset=o) for o in range(4)]
        assert torch.allclose(sum(strided) / 4, full, atol=1e-5)
        assert not torch.allclose(strided[1], full, atol=1e-4)
        last_only = exit_loss(model, batch, (0, 0, 0, 1.0), stride=4)
        assert torch.allclose(last_only, lm_loss(model, batch), atol=1e-6)
    exit_loss(model, batch, weights, stride=4, offset=2).backward()
    assert all(layer.mlp.down_proj.weight.grad.abs().sum() > 0 for layer in model.model.layers)
    # recorded only where set: records of models trained before the option existed are unchanged
    assert "exit_stride" not in config_record(TrainConfig("xs", 1, exit_weights=weights))
    assert config_record(TrainConfig("xs", 1, exit_weights=weights, exit_stride=4))["exit_stride"] == 4


def test_trainer_with_exit_weights_logs_every_exit(tokenizer) -> None:
    weights = linear_exit_weights(2, final=0.5)
    config = TrainConfig("xxs", steps=3, batch_size=2, seq_len=32, warmup=1, exit_weights=weights)
    _, records = train(_slice(tokenizer, 2), config, len(tokenizer), progress=False)
    assert records[0]["config"]["exit_weights"] == weights
    assert all(len(v) == 2 for v in records[-1]["val_exits"].values())
    assert records[-1]["val_exits"].keys() == records[-1]["val"].keys()


def test_se_is_s_trained_for_early_exits() -> None:
    """`se` loads by name but stays out of the family (`names()`: the default target is still `s`);
    its record is what `zoo build` would train again, and the exit loss bought better exits."""
    se = zoo.load("se")
    assert "se" not in zoo.names() and "se" in zoo.names(variants=True)
    fields = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    assert [getattr(se.config, f) for f in fields] == [getattr(zoo.load("s").config, f) for f in fields]
    models = read_manifest(REPO_ZOO)["models"]
    record, s = models["se"], models["s"]
    assert record["grown_from"] == record["variant_of"] == "s" and record["params"] == s["params"]
    config = TrainConfig("se", CPU_STEPS["se"], lr=LEARNING_RATES["se"], exit_weights=EXIT_WEIGHTS["se"])
    assert record["training"] == json.loads(json.dumps(_training_record(config, "cpu")))
    assert record["steps"] == CPU_STEPS["se"]
    # the sizes trained before the option existed keep their records
    for name in ("xxs", "xs", "sm", "s"):
        before = TrainConfig(name, CPU_STEPS[name], lr=LEARNING_RATES[name])
        assert models[name]["training"] == json.loads(json.dumps(_training_record(before, "cpu"))), name
    # its own loss no more than ~0.03 nats worse than s's (mean over the sources)
    assert sum(record["val_loss"][k] - s["val_loss"][k] for k in s["val_loss"]) / len(s["val_loss"]) < 0.03
    exits = read_manifest(REPO_ZOO)["exits"]
    assert exits["se"]["drafts"][-5:] == exits["s"]["drafts"] == [f"exit {k}" for k in range(1, 6)]
    assert exits["se"]["greedy"][-5] > exits["s"]["greedy"][0]  # exit 1


def test_sx_is_s_shape_trained_from_scratch_for_early_exits() -> None:
    """`sx` stays out of the family, its record is what `zoo build` would train again (from scratch,
    exits scored on every 4th position), and its early exits from layer 2 on agree with it more than
    any separately trained zoo model does, greedy and sampled (what the exit loss from scratch buys:
    `s`'s exits owe their agreement to its growth from the smaller sizes)."""
    sx = zoo.load("sx")
    assert "sx" not in zoo.names() and "sx" in zoo.names(variants=True)
    fields = ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size")
    assert [getattr(sx.config, f) for f in fields] == [getattr(zoo.load("s").config, f) for f in fields]
    models = read_manifest(REPO_ZOO)["models"]
    record = models["sx"]
    assert record["grown_from"] is None and record["variant_of"] == "s"
    assert record["params"] == models["s"]["params"] and record["steps"] == CPU_STEPS["sx"]
    config = TrainConfig(
        "sx",
        CPU_STEPS["sx"],
        lr=LEARNING_RATES["sx"],
        exit_weights=EXIT_WEIGHTS["sx"],
        exit_stride=EXIT_STRIDE["sx"],
    )
    assert record["training"] == json.loads(json.dumps(_training_record(config, "cpu")))
    exits = read_manifest(REPO_ZOO)["exits"]["sx"]
    family = ["xxs", "xs", "sm", "s"]
    assert exits["drafts"] == [*family, *(f"exit {k}" for k in range(1, 6))]
    for key in ("greedy", "sum_min_t1"):
        best_model = max(exits[key][: len(family)])
        assert all(rate > best_model for rate in exits[key][len(family) + 1 :]), key  # exits 2..5


def test_zoo_build_builds_every_default_size_by_default() -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    assert tuple(parser.parse_args(["zoo", "build"]).sizes) == DEFAULT_SIZES


def test_new_model_draws_from_its_own_generator() -> None:
    state = torch.random.get_rng_state()
    a = new_model(SIZES["xxs"], vocab_size=300, seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global generator is left alone
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)  # ...and does not matter
        b = new_model(SIZES["xxs"], vocab_size=300, seed=5)
    c = new_model(SIZES["xxs"], vocab_size=300, seed=6)
    for name, weight in a.state_dict().items():
        assert torch.equal(weight, b.state_dict()[name]), name
    assert not torch.equal(a.model.layers[0].mlp.up_proj.weight, c.model.layers[0].mlp.up_proj.weight)
    # HF's Llama initialisation: normal(0, 0.02) matrices, padding row zeroed, RMSNorm weights 1
    embed = a.model.embed_tokens.weight.detach()
    assert a.lm_head.weight is a.model.embed_tokens.weight and embed[a.config.pad_token_id].abs().max() == 0
    std = a.config.initializer_range
    assert abs(float(embed[1:].std()) - std) < 1e-3
    assert abs(float(a.model.layers[1].self_attn.q_proj.weight.detach().std()) - std) < 2e-3
    assert all(torch.all(p == 1) for n, p in a.named_parameters() if n.endswith("norm.weight"))
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the RoPE tables were rebuilt, not left uninitialised
        assert torch.isfinite(a(ids).logits).all()


# -- sources ----------------------------------------------------------------------------------------


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("=head1 NAME\n")


def test_perl_pod_is_found_newest_version_first(tmp_path: Path, monkeypatch) -> None:
    for version in ("5.4.1", "5.30.0", "5.36.0"):
        _touch(tmp_path / version / "pod" / "perl.pod")
    (tmp_path / "5.36").symlink_to("5.36.0")  # Debian's link: the same pages, not another version
    _touch(tmp_path / "5.40.0" / "pod" / "perldiag.pod")  # perl-modules alone, no perl-doc
    monkeypatch.setattr(corpus, "PERL_POD", str(tmp_path / "5.*" / "pod" / "perl.pod"))
    assert locate_sources(("perl-pod",)) == {"perl-pod": tmp_path.resolve() / "5.36.0" / "pod"}


def test_python_docs_prefer_the_running_python(tmp_path: Path, monkeypatch) -> None:
    running = f"python3.{sys.version_info.minor}-doc"
    for name in ("python3.9-doc", running, "python3.99-doc"):
        _touch(tmp_path / name / "html" / "_sources" / "contents.rst.txt")
    monkeypatch.setattr(corpus, "PYTHON_DOCS", str(tmp_path / "python3.*-doc" / "html" / "_sources"))
    assert locate_sources(("python-docs",))["python-docs"] == tmp_path.resolve() / running / "html/_sources"
    (tmp_path / running / "html" / "_sources" / "contents.rst.txt").unlink()  # not installed: the newest
    assert (
        locate_sources(("python-docs",))["python-docs"] == tmp_path.resolve() / "python3.99-doc/html/_sources"
    )


def test_missing_sources_name_their_debian_packages(monkeypatch, capsys, tmp_path) -> None:
    # python-docs present (whatever this machine has installed), perl-pod and bible missing
    running = f"python3.{sys.version_info.minor}-doc"
    _touch(tmp_path / running / "html" / "_sources" / "contents.rst.txt")
    monkeypatch.setattr(corpus, "PYTHON_DOCS", str(tmp_path / "python3.*-doc" / "html" / "_sources"))
    monkeypatch.setattr(corpus, "PERL_POD", "/nonexistent/perl/5.*/pod/perl.pod")
    no_bible = dataclasses.replace(corpus.SOURCES["bible"], locate=lambda: None)
    monkeypatch.setitem(corpus.SOURCES, "bible", no_bible)
    with pytest.raises(MissingSourcesError, match="apt-get install perl-doc bible-kjv") as err:
        next(documents())  # before reading anything
    assert [s.name for s in err.value.missing] == ["perl-pod", "bible"]
    assert main(["zoo", "sources"]) == 1
    out = capsys.readouterr().out
    assert "perl-pod perl-doc" in words(out) and out.count("missing") >= 2 and "apt-get install" in out


# -- calibration windows ---------------------------------------------------------------------------


def _synthetic_corpus(val_lengths: dict[str, int], seed: int) -> TokenCorpus:
    rng = np.random.default_rng(seed)
    val = {name: rng.integers(1, 8000, n).astype(np.uint16) for name, n in val_lengths.items()}
    train = {name: rng.integers(1, 8000, 1000).astype(np.uint16) for name in val_lengths}
    return TokenCorpus(train, val)


def test_calibration_rule_is_deterministic(tmp_path: Path) -> None:
    lengths = {"prose": 5000, "code": 1500, "short": 100}  # "short": not one 128-token window
    data = _synthetic_corpus(lengths, seed=0)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    record = write_calibration(tmp_path / "a", data)
    other_train = TokenCorpus(_synthetic_corpus(lengths, seed=1).train, data.val)  # same held-out text
    write_calibration(tmp_path / "b", other_train)
    stored = (tmp_path / "a" / "calibration.safetensors").read_bytes()
    assert (tmp_path / "b" / "calibration.safetensors").read_bytes() == stored
    # the format: int32 [8, 128] per source, evenly spaced, first and last window flush with the ends
    tensors = load_file(str(tmp_path / "a" / "calibration.safetensors"))
    assert sorted(tensors) == ["code", "prose"] and all(t.dtype == torch.int32 for t in tensors.values())
    for name, windows in tensors.items():
        stream = torch.from_numpy(data.val[name].astype(np.int32))
        assert windows.shape == (8, 128)
        assert torch.equal(windows[0], stream[:128]) and torch.equal(windows[-1], stream[-128:])
    assert all(w.dtype == torch.int64 for w in read_calibration(tmp_path / "a").values())
    # ...recorded in the manifest
    assert read_manifest(tmp_path / "a")["calibration"] == record
    assert record["sha256"] == hashlib.sha256(stored).hexdigest()
    assert record["shapes"] == {"code": [8, 128], "prose": [8, 128]}


def test_committed_calibration_matches_the_manifest() -> None:
    manifest = read_manifest(REPO_ZOO)
    assert calibration_record(REPO_ZOO / "calibration.safetensors") == manifest["calibration"]
    assert manifest["calibration"]["shapes"] == {s: [8, 128] for s in sorted(manifest["corpus"]["sources"])}
    windows = read_calibration(REPO_ZOO)
    assert all(int(w.max()) < manifest["tokenizer"]["vocab_size"] for w in windows.values())


def test_calibration_regenerates_byte_for_byte(tokenizer, tmp_path: Path) -> None:
    """Where the Debian sources are installed (never in CI) and give the recorded text: the committed
    file is exactly what the build's rule writes from the validation documents."""
    if None in locate_sources().values():
        pytest.skip("the corpus sources are not installed (`hsd-fast zoo sources`)")
    docs = list(documents())
    if text_hash(docs) != read_manifest(REPO_ZOO)["corpus"]["text_sha256"]:
        pytest.skip("this machine's corpus text is not the recorded one (`hsd-fast zoo sources --hash`)")
    held = validation_ids(docs)
    # The held-out documents alone give the full corpus's validation streams: the split is per document
    # and every held-out document stays held out among them (its CRC-32 rule, or its source's minimum).
    held_out = tokenize_with([d for d in docs if (d.source, d.doc_id) in held], tokenizer)
    recorded = read_manifest(REPO_ZOO)["corpus"]["sources"]
    assert {s: int(v.size) for s, v in held_out.val.items()} == {s: r["val"] for s, r in recorded.items()}
    write_calibration(tmp_path, held_out)
    committed = (REPO_ZOO / "calibration.safetensors").read_bytes()
    assert (tmp_path / "calibration.safetensors").read_bytes() == committed


# -- what the package ships ------------------------------------------------------------------------


def _package_data(section: str) -> list[str]:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return config["tool"]["setuptools"].get(section, {}).get("hsd_fast.zoo_data", [])


def _globbed(patterns: list[str]) -> set[str]:
    """Files matching package-data ``patterns``, as setuptools' build_py finds them."""
    found = (glob.glob(os.path.join(REPO_ZOO, p), recursive=True) for p in patterns)
    return {f for paths in found for f in paths if os.path.isfile(f)}


def _excluded(patterns: list[str], files: set[str]) -> set[str]:
    """Those of ``files`` that exclude-package-data ``patterns`` drop, as build_py matches them."""
    return {f for f in files if any(fnmatch.fnmatch(f, os.path.join(REPO_ZOO, p)) for p in patterns)}


def test_package_data_is_exactly_what_loading_reads() -> None:
    shipped = _globbed(_package_data("package-data"))
    shipped -= _excluded(_package_data("exclude-package-data"), shipped)
    names = read_manifest(REPO_ZOO)["models"]
    needed = ["manifest.json", "calibration.safetensors", "profile_cpu.json"]
    tokenizers = ["tokenizer", *read_manifest(REPO_ZOO).get("tokenizers", {})]  # shared, then models' own
    needed += [f"{d}/{p.name}" for d in tokenizers for p in (REPO_ZOO / d).iterdir()]
    needed += [f"{name}/{file}" for name in names for file in ("config.json", "model.safetensors")]
    assert sorted(Path(f).relative_to(REPO_ZOO).as_posix() for f in shipped) == sorted(needed)
    # and the stale-SOURCES.txt route (include-package-data) is closed for what stays in the repository
    repository_only = {str(p) for p in [REPO_ZOO / "README.md", *REPO_ZOO.glob("*/train_log.jsonl")]}
    assert _excluded(_package_data("exclude-package-data"), repository_only) == repository_only
