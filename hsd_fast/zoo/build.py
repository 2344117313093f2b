"""``hsd-fast zoo build``: corpus -> tokenizer -> calibration windows -> one trained model per size ->
int8 files + manifest.

The committed tokenizers are reused unless ``retrain_tokenizer`` is set. The token corpus (one per
tokenizer) is cached in ``work_dir`` under its text's hash. The calibration windows
(``calibration.safetensors``) are cut from the corpus's validation tokens by a fixed rule, so the same
corpus gives the same file, byte for byte.
Each model is trained, stored as int8 rows, re-loaded, and its int8 fidelity measured (validation
loss and argmax agreement against the fp32 weights it came from).
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import torch
import transformers

from hsd_fast.report import device_name
from hsd_fast.zoo.calibration import CALIBRATION, read_calibration
from hsd_fast.zoo.corpus import (
    SOURCES,
    VAL_MODULUS,
    Document,
    TokenCorpus,
    documents,
    locate_sources,
    text_hash,
    tokenize,
    validation_ids,
)
from hsd_fast.zoo.models import SIZES, load_int8, new_model, num_params, save_int8
from hsd_fast.zoo.tokenizer import load_tokenizer
from hsd_fast.zoo.tokenizer_training import train_tokenizer
from hsd_fast.zoo.train import (
    TrainConfig,
    config_record,
    exit_logits,
    held_out_windows,
    linear_exit_weights,
    precision,
    train,
    validation_loss,
    validation_windows,
)
from hsd_fast.zoo.twin import cost_twin

# A CPU budget cannot train each size from scratch to beat the smaller ones (docs/design.md, 'The zoo':
# minutes per model; a 4.0 M model trained from scratch for as long as xxs ended worse than xxs), so
# each size after the first starts from the previous one, expanded by `cost_twin` (same function, larger
# shape), and trains on: every size has seen its parent's tokens plus its own.
GROWN_FROM = {"xs": "xxs", "sm": "xs", "s": "sm", "m": "s", "l": "m"}
# Variants: a size's shape trained for another purpose, kept out of the family (`zoo.names()`).
# se: s trained on (its weights as the start, no cost_twin) for early exits, with a LayerSkip-style
# loss (every layer's output through the final norm and head; the last layer keeps 0.4 of the weight,
# the others share the rest in proportion to depth), so that its first k layers make good drafts
# (hsd_fast.EarlyExit). sx: s's shape trained *from scratch* with the same loss. s was grown from xs and
# sm, so its (and se's) early layers stay close to those drafts and cost more than they do; sx's layers
# owe nothing to the smaller sizes, as a real target's early layers owe nothing to its separately trained
# drafts. Its early exits are scored on every 4th position (`TrainConfig.exit_stride`), which makes a
# step 1.35x a plain one instead of 2.3x.
VARIANTS = {"se": "s", "sx": "s"}  # variant -> the size whose shape it has
GROWN_FROM |= {"se": "s"}
EXIT_WEIGHTS = {name: linear_exit_weights(SIZES["s"].num_layers, final=0.4) for name in VARIANTS}
EXIT_STRIDE = {"sx": 4}
# Models on a tokenizer of their own, for drafting across tokenizers: xs4k, the shape of xs over a
# byte-level BPE of 4096 entries. Such a tokenizer is trained as the shared one (zoo/tokenizer) was, by
# `train_tokenizer` on the same training documents with another vocabulary size, and committed in a
# directory of its own beside zoo/tokenizer (named by its size, not by a model, so further models can share
# it; the model's manifest record names it). The model is trained from scratch (no zoo model shares its ids
# to grow from) on the corpus in that tokenizer's ids, and stays out of the family (`zoo.names()`): it
# cannot draft for the family token for token.
OWN_TOKENIZER = {"xxs4k": "tokenizer_4096", "xs4k": "tokenizer_4096"}
TOKENIZER_VOCAB = {"tokenizer": 8192, "tokenizer_4096": 4096}  # directory under zoo/ -> entries
SHAPE_OF = {"xxs4k": "xxs", "xs4k": "xs", "sx": "s"}
# Steps of 16 x 256 tokens per size, sized for the 2-core CPU machine (~8 minutes for xxs from scratch;
# an se step computes the head six times: ~2x an s step; an sx step 1.85 s on 2 threads; an xs4k step:
# ~0.45 s on 2 threads, 0.7 on 1).
# xs4k takes as many steps as xs has seen with its parent (1000 + 250): the two drafts of one shape, on
# two tokenizers, compare at equal training.
CPU_STEPS = {"xxs": 1000, "xs": 250, "sm": 250, "s": 250, "m": 250, "l": 250, "se": 160, "xs4k": 1250}
CPU_STEPS["xxs4k"] = CPU_STEPS["xxs"]  # a draft for xs4k in their tokenizer, trained as xxs is
CPU_STEPS["sx"] = 1400  # from scratch: 5.7 M tokens, about what s has seen with its parents
LEARNING_RATES = {"xxs": 3e-3, "xs": 1.5e-3, "sm": 1.5e-3, "s": 1.5e-3, "m": 1e-3, "l": 1e-3, "se": 1e-3}
LEARNING_RATES["xs4k"] = LEARNING_RATES["xxs4k"] = LEARNING_RATES["sx"] = 3e-3  # from scratch, as xxs
DEFAULT_SIZES = ("xxs", "xs", "sm", "s", "se", "sx", "xxs4k", "xs4k")


def read_manifest(zoo_dir: Path) -> dict:
    path = zoo_dir / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else {"version": 1, "models": {}}


def write_manifest(zoo_dir: Path, manifest: dict) -> None:
    (zoo_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def tokenize_with(docs: list[Document], tokenizer) -> TokenCorpus:
    """``docs`` encoded by the zoo tokenizer (a ``PreTrainedTokenizerFast``), in batches."""
    encode = tokenizer.backend_tokenizer.encode_batch
    return tokenize(docs, lambda texts: [e.ids for e in encode(texts)], tokenizer.eos_token_id)


def ensure_tokenizer(directory: Path, docs: list[Document], vocab_size: int, retrain: bool = False):
    """The tokenizer under ``directory``, trained on the training documents of ``docs`` first where it
    is missing or ``retrain`` is set."""
    if retrain or not (directory / "tokenizer.json").is_file():
        held = validation_ids(docs)
        tokenizer = train_tokenizer((d.text for d in docs if (d.source, d.doc_id) not in held), vocab_size)
        tokenizer.save_pretrained(str(directory))
    return load_tokenizer(directory)


def cached_tokens(work_dir: Path, name: str, docs: list[Document], tokenizer) -> tuple[TokenCorpus, Path]:
    """``docs`` in ``tokenizer``'s ids, from ``work_dir``'s cache (file ``name``) or encoded and cached."""
    cached = work_dir / name
    if cached.is_file():
        return TokenCorpus.load(cached), cached
    work_dir.mkdir(parents=True, exist_ok=True)
    corpus = tokenize_with(docs, tokenizer)
    corpus.save(cached)
    return corpus, cached


def val_bytes_per_token(corpus: TokenCorpus, tokenizer) -> dict[str, float]:
    """Per source, the bytes of text per predicted token of the validation windows (the targets of
    ``validation_windows`` under the default ``TrainConfig``), so validation losses of models on
    different tokenizers compare per byte: nats per byte = nats per token / bytes per token. Byte-level
    BPE: an entry's string has one character per byte; the special token (EOS) counts none."""
    lengths = torch.tensor([len(t) for t in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))])
    lengths[tokenizer.all_special_ids] = 0
    windows = validation_windows(corpus, TrainConfig("any", steps=1))
    return {k: round(float(lengths[w[:, 1:]].sum()) / w[:, 1:].numel(), 4) for k, w in windows.items()}


def build_corpus(zoo_dir: Path, work_dir: Path, retrain_tokenizer: bool = False) -> TokenCorpus:
    manifest = read_manifest(zoo_dir)
    for name, path in locate_sources().items():
        print(f"corpus source {name}: {path or 'missing'}")
    docs = list(documents())  # raises MissingSourcesError, naming the Debian packages, first
    tokenizer = ensure_tokenizer(zoo_dir / "tokenizer", docs, TOKENIZER_VOCAB["tokenizer"], retrain_tokenizer)
    digest = text_hash(docs)
    recorded = manifest.get("corpus", {})
    corpus, cached = cached_tokens(work_dir, f"tokens-{digest[:16]}.npz", docs, tokenizer)
    if recorded.get("text_sha256") not in (None, digest):
        print(f"note: this machine's text differs from the recorded corpus ({recorded['text_sha256'][:12]})")
    chars: dict[str, int] = {}
    counts: dict[str, int] = {}
    for doc in docs:
        chars[doc.source] = chars.get(doc.source, 0) + len(doc.text)
        counts[doc.source] = counts.get(doc.source, 0) + 1
    manifest["corpus"] = {
        "text_sha256": digest,
        "tokens_sha256": corpus.hash(),
        "token_file": cached.name,
        "python": platform.python_version(),
        "val_modulus": VAL_MODULUS,  # the held-out rule (corpus.validation_ids)
        "sources": {
            name: {
                "package": SOURCES[name].package,
                "documents": counts[name],
                "chars": chars[name],
                **corpus.summary()[name],
            }
            for name in counts
        },
    }
    manifest["tokenizer"] = {
        "vocab_size": len(tokenizer),
        "eos_id": tokenizer.eos_token_id,
        "val_bytes_per_token": val_bytes_per_token(corpus, tokenizer),
    }
    write_manifest(zoo_dir, manifest)
    return corpus


def build_tokenizer_corpus(
    zoo_dir: Path, work_dir: Path, directory: str, retrain: bool = False
) -> TokenCorpus:
    """The corpus in the ids of tokenizer ``directory`` (one of ``TOKENIZER_VOCAB``, trained where
    missing), recorded in the manifest's ``tokenizers``: its size, how many of its first ids name the same
    entries as the shared tokenizer's, and its token arrays (hash, counts, bytes per validation token)."""
    docs = list(documents())  # the text ``build_corpus`` read
    tokenizer = ensure_tokenizer(zoo_dir / directory, docs, TOKENIZER_VOCAB[directory], retrain)
    if tokenizer.eos_token_id != 0:  # llama_config's default: the models are built for id 0
        raise ValueError(f"{zoo_dir / directory}: EOS is id {tokenizer.eos_token_id}, not 0")
    shared = load_tokenizer(zoo_dir / "tokenizer").convert_ids_to_tokens(list(range(len(tokenizer))))
    mine = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    same = next((i for i, (a, b) in enumerate(zip(mine, shared, strict=False)) if a != b), len(mine))
    name = f"tokens-{text_hash(docs)[:16]}-{directory}.npz"
    corpus, _ = cached_tokens(work_dir, name, docs, tokenizer)
    manifest = read_manifest(zoo_dir)
    manifest.setdefault("tokenizers", {})[directory] = {
        "vocab_size": len(tokenizer),
        "eos_id": tokenizer.eos_token_id,
        "same_ids_as_shared": same,  # ids 0..same-1 name the same entries in the shared tokenizer
        "tokens_sha256": corpus.hash(),
        "token_file": name,
        "sources": corpus.summary(),
        "val_bytes_per_token": val_bytes_per_token(corpus, tokenizer),
    }
    write_manifest(zoo_dir, manifest)
    return corpus


@torch.no_grad()
def int8_fidelity(model, stored, windows) -> dict:
    agree, total = 0, 0
    for batch in windows.values():
        a = model(input_ids=batch[:, :-1]).logits.argmax(-1)
        b = stored(input_ids=batch[:, :-1]).logits.argmax(-1)
        agree, total = agree + int((a == b).sum()), total + a.numel()
    return {"val_loss_int8": validation_loss(stored, windows, "cpu"), "int8_argmax_agreement": agree / total}


def build_model(
    zoo_dir: Path, corpus: TokenCorpus, size: str, steps: int | None = None, device: str = "cpu"
) -> dict:
    manifest = read_manifest(zoo_dir)
    own = OWN_TOKENIZER.get(size)
    vocab_size = (manifest["tokenizers"][own] if own else manifest["tokenizer"])["vocab_size"]
    parent = GROWN_FROM.get(size) if GROWN_FROM.get(size) in manifest["models"] else None
    if size in GROWN_FROM and parent is None and size in VARIANTS:
        raise ValueError(f"{size} is trained on from {VARIANTS[size]}: build {VARIANTS[size]} first")
    config = TrainConfig(
        size,
        steps=steps or CPU_STEPS[size],
        lr=LEARNING_RATES[size],
        grown_from=parent,
        exit_weights=EXIT_WEIGHTS.get(size),
        exit_stride=EXIT_STRIDE.get(size, 1),
    )
    init = None
    if parent:
        init = load_int8(zoo_dir / parent)
        init = init if size in VARIANTS else cost_twin(init, shape=size)
    elif size in SHAPE_OF:  # what `train` would draw for a size of that name
        init = new_model(SIZES[SHAPE_OF[size]], vocab_size, seed=config.seed)
    out = zoo_dir / size
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    model, records = train(
        corpus, config, vocab_size, device=device, log_path=out / "train_log.jsonl", init=init
    )
    seconds = time.perf_counter() - start
    model = model.float().cpu()
    save_int8(model, out)
    windows = validation_windows(corpus, config)
    card = {
        "shape": {
            "hidden_size": model.config.hidden_size,
            "num_layers": model.config.num_hidden_layers,
            "num_heads": model.config.num_attention_heads,
            "head_dim": model.config.head_dim,
            "intermediate_size": model.config.intermediate_size,
        },
        "params": num_params(model),
        "grown_from": parent,
        "steps": config.steps,
        "training": _training_record(config, device),
        "tokens_seen": config.steps * config.tokens_per_step
        + (manifest["models"][parent]["tokens_seen"] if parent else 0),
        "val_loss": records[-1]["val"],
        **({"variant_of": VARIANTS[size]} if size in VARIANTS else {}),
        **({"tokenizer": own} if own else {}),
        **({"val_loss_exits": records[-1]["val_exits"]} if "val_exits" in records[-1] else {}),
        **int8_fidelity(model, load_int8(out), windows),
        "train_seconds": round(seconds, 1),
        "device": device_name(device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
    }
    manifest = read_manifest(zoo_dir)
    manifest["models"][size] = card
    write_manifest(zoo_dir, manifest)
    return card


def _training_record(config: TrainConfig, device: str) -> dict:
    """What the card states of a model's training: its ``TrainConfig`` (size, steps and parent are
    recorded beside it) and the precision it was computed in."""
    record = {k: v for k, v in config_record(config).items() if k not in ("size", "steps", "grown_from")}
    return record | {"precision": precision(device)}


def build(
    zoo_dir: Path,
    work_dir: Path,
    sizes: Sequence[str] = DEFAULT_SIZES,
    steps: int | None = None,
    device: str = "cpu",
    retrain_tokenizer: bool = False,
    tokens: Path | None = None,
) -> dict:
    """Build the zoo. ``tokens``: a token file carried from the machine that built the corpus (its
    hash must equal the manifest's), for machines without the corpus text (the GPU machine); it holds
    the shared tokenizer's ids only, so models on a tokenizer of their own cannot be built from it."""
    if tokens is not None and any(size in OWN_TOKENIZER for size in sizes):
        raise ValueError(
            f"{[s for s in sizes if s in OWN_TOKENIZER]} train on their own tokenizer's ids, not the shared "
            f"one's that {tokens} holds: build them where the corpus text is (`hsd-fast zoo sources`)"
        )
    if tokens is not None:
        expected = read_manifest(zoo_dir).get("corpus", {}).get("tokens_sha256")
        if expected is None:
            raise ValueError(f"{zoo_dir}/manifest.json records no corpus hash to check {tokens} against")
        corpus = TokenCorpus.load(tokens, expected_hash=expected)
    else:
        corpus = build_corpus(zoo_dir, work_dir, retrain_tokenizer)
    write_calibration(zoo_dir, corpus)
    corpora = {}
    for size in sizes:
        own = OWN_TOKENIZER.get(size)
        if own and own not in corpora:
            corpora[own] = build_tokenizer_corpus(zoo_dir, work_dir, own, retrain_tokenizer)
        card = build_model(zoo_dir, corpora[own] if own else corpus, size, steps, device)
        print(f"{size}: {card['params'] / 1e6:.2f} M params, val {card['val_loss']}")
    return read_manifest(zoo_dir)


CALIBRATION_WINDOWS = 8  # per source
CALIBRATION_LENGTH = 128  # tokens per window


def calibration_windows(
    corpus: TokenCorpus, windows: int = CALIBRATION_WINDOWS, length: int = CALIBRATION_LENGTH
) -> dict[str, torch.Tensor]:
    """The rule that makes ``calibration.safetensors``: ``windows`` evenly spaced windows of ``length``
    tokens from each source's validation stream (the one the trainer validates on), int32. It reads
    only ``corpus.val``, i.e. only the held-out documents."""
    return {k: v.to(torch.int32).contiguous() for k, v in held_out_windows(corpus, windows, length).items()}


def write_calibration(zoo_dir: Path, corpus: TokenCorpus) -> dict:
    """Write the held-out windows, so acceptance and the selector can be measured on machines
    without the corpus: ``calibration.safetensors``, one [windows, length] int32 tensor per source.
    Recorded (shapes, sha256 of the file) in the manifest; returns the record."""
    from safetensors.torch import save_file

    path = zoo_dir / CALIBRATION
    save_file(calibration_windows(corpus), str(path))  # no metadata, keys sorted: same tensors, same bytes
    record = calibration_record(path)
    manifest = read_manifest(zoo_dir)
    manifest["calibration"] = record
    write_manifest(zoo_dir, manifest)
    return record


def calibration_record(path: Path) -> dict:
    """What the manifest records of a calibration file: its name, tensor shapes and sha256."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as stored:
        shapes = {k: list(stored.get_slice(k).get_shape()) for k in sorted(stored.keys())}
    return {"file": path.name, "shapes": shapes, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def measure_acceptance(zoo_dir: Path, names: Sequence[str], progress: bool = True) -> dict:
    """alpha over the zoo on the committed calibration windows: greedy argmax agreement and
    sum-min(p, q) at temperature 1, pooled over all sources and per source."""
    from hsd_fast.profile import acceptance

    models = [load_int8(zoo_dir / name) for name in names]
    windows = read_calibration(zoo_dir)
    pooled = torch.cat(list(windows.values()))
    result = {"models": list(names), "tokens": int(pooled.numel())}
    for key, greedy in (("greedy", True), ("sum_min_t1", False)):
        result[key] = _rounded(acceptance(models, pooled, greedy=greedy, progress=progress))
        result[f"{key}_per_source"] = {
            source: _rounded(acceptance(models, ids, greedy=greedy, progress=False))
            for source, ids in windows.items()
        }
    return result


def _rounded(matrix: list[list[float]]) -> list[list[float]]:
    return [[round(x, 4) for x in row] for row in matrix]


def measure_exits(zoo_dir: Path, name: str, drafts: Sequence[str] = (), progress: bool = True) -> dict:
    """The early exits of zoo model ``name`` (its first k layers, then its final norm and head, for
    k = 1..L-1), and the zoo models ``drafts``, as drafts of the full ``name``: greedy agreement and
    sum-min(p, q) at temperature 1 on the committed calibration windows (pooled), measured as
    ``measure_acceptance`` measures the zoo (``hsd_fast.profile.acceptance``, teacher-forced)."""
    from hsd_fast.profile import acceptance

    target = load_int8(zoo_dir / name)
    exits = range(1, target.config.num_hidden_layers)
    candidates = [*(load_int8(zoo_dir / d) for d in drafts), *(_Exit(target, k) for k in exits)]
    pooled = torch.cat(list(read_calibration(zoo_dir).values()))
    labels = [*drafts, *(f"exit {k}" for k in exits)]
    result = {"target": name, "drafts": labels, "tokens": int(pooled.numel())}
    for key, greedy in (("greedy", True), ("sum_min_t1", False)):
        alpha = acceptance([*candidates, target], pooled, greedy=greedy, progress=progress)
        result[key] = [round(row[-1], 4) for row in alpha[:-1]]  # each candidate against the target
    return result


class _Exit(torch.nn.Module):
    """``model``'s exit after its first ``k`` layers, as a model ``acceptance`` can score: the logits
    of ``lm_head(norm(hidden_states[k]))`` (computed by the whole model: measuring, not drafting)."""

    def __init__(self, model: torch.nn.Module, k: int) -> None:
        super().__init__()
        self.model, self.k, self.config = model, k, model.config

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.get_input_embeddings()

    def forward(self, input_ids: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=exit_logits(self.model, input_ids, [self.k])[0])
