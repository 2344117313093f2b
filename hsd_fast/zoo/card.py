"""``zoo/README.md``, rendered from ``zoo/manifest.json`` (so the card always matches the files)."""

from __future__ import annotations

from hsd_fast.report import markdown_table

MODEL_COLUMNS = ["name", "hidden", "layers", "heads x dim", "MLP", "params", "grown from", "tokens seen"]
MODEL_COLUMNS += ["train time", "device"]


def matrix_table(names: list[str], matrix: list[list[float]]) -> list[str]:
    rows = [[n, *(f"{x:.3f}" for x in row)] for n, row in zip(names, matrix, strict=True)]
    return markdown_table(["draft \\ verifier", *names], rows)


def exit_table(measured: dict) -> list[str]:
    """``measure_exits``'s result: each draft's greedy agreement and sum-min with the full target."""
    rows = zip(measured["drafts"], measured["greedy"], measured["sum_min_t1"], strict=True)
    return markdown_table(
        [f"draft of {measured['target']}", "greedy", "sum-min t=1"],
        [[name, f"{g:.3f}", f"{m:.3f}"] for name, g, m in rows],
    )


def render(manifest: dict) -> str:
    corpus, models = manifest["corpus"], manifest["models"]
    # the models on the shared tokenizer (the family and its variants); those on their own: own_lines
    names = sorted((n for n in models if "tokenizer" not in models[n]), key=lambda n: models[n]["params"])
    others = sorted((n for n in models if "tokenizer" in models[n]), key=lambda n: models[n]["params"])
    sources = list(corpus["sources"])
    out = [
        "# The hsd_fast model zoo",
        "",
        "A family of small Llama-architecture causal LMs sharing one byte-level BPE tokenizer "
        f"({manifest['tokenizer']['vocab_size']} entries, id {manifest['tokenizer']['eos_id']} = "
        "`<|endoftext|>`: BOS, EOS and padding), trained by `hsd-fast zoo build` and stored as int8 rows "
        "with bf16 scales. Load with `hsd_fast.zoo.load(name)` / `hsd_fast.zoo.load_tokenizer()`"
        + (
            f"; {_and([f'`{n}`' for n in others])}, on a tokenizer of "
            + ("its" if len(others) == 1 else "their")
            + " own, with `hsd_fast.zoo.load_tokenizer(name)` (below)"
            if others
            else ""
        )
        + ". These are tiny, briefly trained models: good enough for speculative decoding to have "
        "something to accept, not for useful text.",
        "",
        "## Models",
        "",
        *markdown_table(
            [*MODEL_COLUMNS, *(f"val loss {s}" for s in sources), "int8 argmax agreement"],
            [_model_row(name, models[name], sources) for name in names],
        ),
    ]
    out += [
        "",
        "Validation loss (nats per token) is measured on held-out documents of each source with the fp32 "
        "weights before quantisation; the int8 weights give "
        + ", ".join(
            f"{n}: " + "/".join(f"{models[n]['val_loss_int8'].get(s, float('nan')):.3f}" for s in sources)
            for n in names
        )
        + " (same sources, same order). Argmax agreement compares the int8 model with its fp32 weights "
        "on the same windows.",
        "",
    ]
    accept = manifest.get("acceptance")
    if accept:
        out += [
            "## Acceptance",
            "",
            f"Measured by `hsd_fast.profile.acceptance()` ({accept['tokens']} teacher-forced held-out "
            "tokens, "
            "`zoo/calibration.safetensors`, every source pooled) with `hsd-fast zoo accept --write`.",
            "",
            "Greedy: how often the two models' argmaxes agree.",
            "",
            *matrix_table(accept["models"], accept["greedy"]),
            "",
            "Sampling at temperature 1: sum_x min(p(x), q(x)), the probability that speculative sampling "
            "accepts a draft token.",
            "",
            *matrix_table(accept["models"], accept["sum_min_t1"]),
            "",
            "Per source, adjacent sizes (sum-min at temperature 1 / greedy agreement):",
            "",
            *markdown_table(["pair", *accept["sum_min_t1_per_source"]], _adjacent_rows(accept)),
            "",
        ]
    out += _exit_lines(manifest)
    out += [line for name in others for line in _own_tokenizer_lines(manifest, name, names)]
    source_rows = [
        [s, info["documents"], f"{info['chars'] / 1e6:.1f} M", *_train_val(info)]
        for s, info in corpus["sources"].items()
    ]
    packages = [info["package"] for info in corpus["sources"].values() if info["package"]]
    trainings = {name: models[name]["training"] for name in names}

    def shared(key: str, show=str) -> str:
        return _per_model(trainings, key, show)

    out += [
        "## Data",
        "",
        "Text present offline (`hsd_fast/zoo/corpus.py`): "
        + _and([_source_text(s, info, corpus["python"]) for s, info in corpus["sources"].items()])
        + ". A document is held out when the CRC-32 of its id is 0 mod "
        f"{corpus['val_modulus']}, plus the smallest CRC-32 of each source.",
        "",
        *markdown_table(
            ["source", "documents", "characters", "train tokens", "validation tokens"], source_rows
        ),
        "",
        f"Corpus text sha256 `{corpus['text_sha256']}`; token arrays sha256 `{corpus['tokens_sha256']}` "
        "(`TokenCorpus.hash()`: another machine checks it has the same tokens with "
        "`TokenCorpus.load(path, expected_hash=...)`).",
        "",
        *_calibration_lines(manifest.get("calibration")),
        "## Training",
        "",
        "The smallest model is trained from scratch. On a CPU budget a larger model trained from scratch "
        "for the same minutes sees fewer tokens and ends *worse* than the smaller ones (docs/design.md, "
        "'The zoo'), so every further size is *grown*: the previous model expanded by "
        "`hsd_fast.zoo.cost_twin` (the same function in the larger shape, head dim kept) and trained on. "
        "'Tokens seen' counts the parent's tokens too. Grown models start as exact copies of their "
        "parents, so neighbours agree more than independently trained models of these sizes would.",
        "",
        *_variant_lines(models),
        f"AdamW (betas {shared('betas', lambda b: '/'.join(map(str, b)))}, weight decay "
        f"{shared('weight_decay')} on matrices, gradient clip {shared('grad_clip')}), batches of "
        f"{shared('batch_size')} random windows of {shared('seq_len')} tokens drawn uniformly over all "
        f"training tokens, linear warm-up over {shared('warmup')} steps to a peak rate of {shared('lr')} "
        f"then cosine to {shared('min_lr_ratio', lambda r: f'{r:.0%}')} of it, seed {shared('seed')}; "
        f"computed in {shared('precision')}. Per-step logs with the validation loss per source every "
        f"{shared('eval_every')} steps: `zoo/<name>/train_log.jsonl` (in the repository; the installed "
        "package ships only what loading needs).",
        "",
        *_gpu_lines(models),
        "Rebuild (needs `apt-get install " + " ".join(packages) + "`: `hsd-fast zoo sources` "
        "shows what this machine has, `--hash` whether its text is the recorded corpus; reuses the "
        "committed tokenizers unless `--retrain-tokenizer`):",
        "",
        "```bash",
        "hsd-fast zoo --zoo-dir zoo build --sizes "
        + " ".join([*names, *others])
        + " && hsd-fast zoo --zoo-dir zoo accept --write"
        + (" --exits" if manifest.get("exits") else ""),
        "```",
        "",
    ]
    return "\n".join(out)


def _exit_lines(manifest: dict) -> list[str]:
    """A section per model trained for early exits: its exits and the zoo's sizes as its drafts,
    beside the same exits of the model it was trained on from."""
    models, measured = manifest["models"], manifest.get("exits", {})
    out = []
    for name, record in models.items():
        if name not in measured or "exit_weights" not in record["training"]:
            continue
        # compared with the model it was trained on from, or (trained from scratch) the size of its shape
        mine, parent = measured[name], record["grown_from"] or record["variant_of"]
        theirs = measured.get(parent, {"drafts": []})
        exit_losses = record.get("val_loss_exits", {})
        rows = []
        for i, draft in enumerate(mine["drafts"]):
            if draft in models:
                loss = sum(models[draft]["val_loss"].values()) / len(models[draft]["val_loss"])
            elif exit_losses:
                depth = int(draft.split()[-1])
                loss = sum(v[depth - 1] for v in exit_losses.values()) / len(exit_losses)
            else:
                loss = None
            j = theirs["drafts"].index(draft) if draft in theirs["drafts"] else None
            rows.append([
                draft, f"{mine['greedy'][i]:.3f}", f"{mine['sum_min_t1'][i]:.3f}",
                "-" if j is None else f"{theirs['greedy'][j]:.3f}",
                "-" if j is None else f"{theirs['sum_min_t1'][j]:.3f}",
                "-" if loss is None else f"{loss:.3f}",
            ])  # fmt: skip
        ancestors, up = [], models[parent]["grown_from"]
        while up:
            ancestors, up = [up, *ancestors], models[up]["grown_from"]
        grown = (
            f" `{parent}` was grown from "
            + _and([f"`{a}` ({models[a]['shape']['num_layers']} layers)" for a in ancestors])
            + " by appending layers that started out writing nothing (`cost_twin`), so some of its "
            "exits were once those models' outputs."
            if ancestors
            else ""
        )
        header = [f"draft of {name}", "greedy", "sum-min t=1", f"{parent}'s: greedy"]
        header += [f"{parent}'s: sum-min t=1", "val loss"]
        layers = record["shape"]["num_layers"]
        weights = "/".join(f"{w:g}" for w in record["training"]["exit_weights"])
        stride = record["training"].get("exit_stride", 1)
        start = (
            f"`{parent}` trained on for {record['steps']} steps"
            if record["grown_from"]
            else f"`{parent}`'s shape trained from scratch for {record['steps']} steps"
        )
        scored = f" (layers 1..{layers - 1} on every {stride}th position)" if stride > 1 else ""
        peer = "" if record["grown_from"] else f" (the `{parent}` row: another training of the same shape)"
        out += [
            f"## Early exits of {name}",
            "",
            f"`{name}` is {start} with an early-exit loss "
            "(LayerSkip-style): the cross-entropy of every layer's output passed through the model's own "
            f"final norm and head, weighted {weights} for layers 1..{layers}{scored}. Exit k is the first k "
            f"layers, the final norm and the head (`hsd_fast.EarlyExit({name}, k)`), drafting for the "
            f"full `{name}`; the zoo's sizes are listed as drafts of `{name}` to compare. Measured by "
            f"`hsd-fast zoo accept --exits --write` (`hsd_fast.zoo.build.measure_exits`: "
            f"`hsd_fast.profile.acceptance`, {mine['tokens']} teacher-forced calibration tokens, every "
            f"source pooled); the `{parent}` columns: the same exits of `{parent}` (never trained for "
            f"them) against the full `{parent}`{peer}. Validation loss: the mean over the sources of the "
            "exit's (or the model's) loss on the validation windows." + grown,
            "",
            *markdown_table(header, rows),
            "",
        ]
    return out


def _own_tokenizer_lines(manifest: dict, name: str, shared: list[str]) -> list[str]:
    """A section for a model on a tokenizer of its own: that tokenizer, the model's training, and its
    validation loss per token and per byte beside the shared-tokenizer model of the same shape."""
    models, record = manifest["models"], manifest["models"][name]
    directory = record["tokenizer"]
    mine, theirs = manifest["tokenizers"][directory], manifest["tokenizer"]
    shape, training = record["shape"], record["training"]
    peers = [n for n in shared if models[n]["shape"] == shape and "variant_of" not in models[n]]
    same, size = mine["same_ids_as_shared"], mine["vocab_size"]
    if same == size:
        nested = (
            f"Its ids 0..{size - 1} name the same entries as the shared tokenizer's (BPE learns its merges "
            f"in the same order from the same text: the smaller vocabulary is the first {size} entries of "
            "the larger), but it splits text into more, shorter tokens"
        )
    else:
        nested = f"Its first {same} ids name the same entries as the shared tokenizer's; its splits differ"
    per_byte = "val_bytes_per_token" in theirs
    if per_byte:
        nested += (
            f": {_mean(mine['val_bytes_per_token']):.2f} bytes per validation token against "
            f"{_mean(theirs['val_bytes_per_token']):.2f} (mean over the sources). Validation losses per "
            "token do not compare across tokenizers; per byte they do (nats per token / bytes per token; "
            "below, each source's loss: nats per token / nats per byte)"
        )
    sources = list(record["val_loss"])
    rows = []
    for n, bytes_per_token in [(name, mine), *((p, theirs) for p in peers)]:
        card = models[n]
        losses = card["val_loss"]
        rows.append([
            n, bytes_per_token["vocab_size"], f"{card['params'] / 1e6:.2f} M", card["grown_from"] or "-",
            f"{card['tokens_seen'] / 1e6:.2f} M", f"{card['train_seconds'] / 60:.1f} min", card["device"],
            *(
                f"{losses[s]:.3f} / {losses[s] / bytes_per_token['val_bytes_per_token'][s]:.3f}"
                if per_byte else f"{losses[s]:.3f}"
                for s in sources
            ),
            f"{card['int8_argmax_agreement']:.4f}",
        ])  # fmt: skip
    header = ["name", "tokenizer", "params", "grown from", "tokens seen", "train time", "device"]
    header += [*(f"val loss {s}" for s in sources), "int8 argmax agreement"]
    counts = mine["sources"].values()
    corpus = record.get("corpus")
    tokens_sha = corpus["tokens_sha256"] if corpus else mine["tokens_sha256"]
    differs = _other_corpus(record)
    return [
        f"## {name}: a draft on another tokenizer",
        "",
        f"`{name}` has the shape of {_and([f'`{p}`' for p in peers]) if peers else 'its own'} (hidden "
        f"{shape['hidden_size']}, {shape['num_layers']} layers, {shape['num_heads']} x {shape['head_dim']} "
        f"heads, MLP {shape['intermediate_size']}; {record['params'] / 1e6:.2f} M parameters) over a "
        f"byte-level BPE tokenizer of its own, {size} entries (`zoo/{directory}`, "
        f'`hsd_fast.zoo.load_tokenizer("{name}")`; id {mine["eos_id"]} = `<|endoftext|>`), trained as the '
        "shared one was (`train_tokenizer`) on the same training documents. It is trained from scratch "
        f"(no zoo model shares its ids to grow from) for {record['steps']} steps at a peak rate of "
        f"{training['lr']}, otherwise as the family (below), on the corpus in its tokenizer's ids "
        f"({sum(c['train'] for c in counts) / 1e6:.2f} M training tokens, "
        f"{sum(c['val'] for c in counts) / 1e3:.1f} k validation; token arrays sha256 "
        f"`{tokens_sha}`). It is not in `zoo.names()` (it cannot draft for the family token for "
        "token; `names(variants=True)` lists it). " + nested + "." + differs,
        "",
        *markdown_table(header, rows),
        "",
        f"Acceptance of `{name}` drafting for the family across tokenizers (through hsd_fast's byte bridge, "
        "`hsd_fast.OtherTokenizerDraft`): the share of its proposals the target passes and the target's "
        "tokens per forward, greedy and at temperature 0.8, in `bench/results/other_tokenizer_*.md` "
        "(`python bench/bench_other_tokenizer.py`); not in this card's teacher-forced matrix, which "
        "compares ids position by position.",
        "",
    ]


def _mean(values: dict[str, float]) -> float:
    return sum(values.values()) / len(values)


def _other_corpus(record: dict) -> str:
    """A sentence for a model built from other text than the recorded corpus (its ``corpus`` record),
    else nothing."""
    corpus = record.get("corpus")
    if not corpus:
        return ""
    return (
        f" Its corpus text (sha256 `{corpus['text_sha256']}`) is not the recorded one: {corpus['differs']}."
    )


def _variant_lines(models: dict) -> list[str]:
    """What each variant (a size trained on in its own shape for another purpose) is."""
    lines = []
    for name, card in models.items():
        if "variant_of" not in card:
            continue
        size = card["variant_of"]
        change = sum(card["val_loss"][s] - models[size]["val_loss"][s] for s in card["val_loss"])
        purpose = (
            "the early-exit loss ('Early exits of " + name + "')"
            if "exit_weights" in card["training"]
            else "the LM loss"
        )
        start = (
            f"`{size}`'s weights as the start (no `cost_twin`), trained on"
            if card["grown_from"]
            else f"trained from scratch ({card['tokens_seen'] / 1e6:.1f} M tokens)"
        )
        lines.append(
            f"`{name}` is a variant of `{size}`: the same shape, {start} with {purpose}; its own "
            f"validation loss differs from `{size}`'s by {change / len(card['val_loss']):+.3f} nats "
            "(mean over the sources)." + _other_corpus(card)
        )
    return [" ".join(lines), ""] if lines else []


SOURCE_TEXTS = {  # what each corpus source is, for the card's prose; {debian}: its package, if any
    "python-code": "the Python standard library's code (Python {python}, tests excluded){debian}",
    "python-docs": "the Python docs' reST sources{debian}",
    "perl-pod": "Perl's pod pages{debian}",
    "bible": "the King James Bible{debian}, one document per chapter",
}


def _source_text(name: str, info: dict, python: str) -> str:
    debian = f" (Debian `{info['package']}`)" if info["package"] else ""
    return SOURCE_TEXTS.get(name, name + "{debian}").format(python=python, debian=debian)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _per_model(records: dict[str, dict], key: str, show=str) -> str:
    """``records[name][key]`` of every model: once where they share it, else each value with the
    models that have it (``0.003 (xxs), 0.0015 (xs, sm, s)``)."""
    groups: dict[str, list[str]] = {}
    for name, record in records.items():
        groups.setdefault(show(record[key]), []).append(name)
    if len(groups) == 1:
        return next(iter(groups))
    return ", ".join(f"{value} ({', '.join(names)})" for value, names in groups.items())


def _gpu_lines(models: dict) -> list[str]:
    """A pointer to the GPU training stage while every model was trained on a CPU."""
    if any(not card["device"].startswith("cpu") for card in models.values()):
        return []
    return [
        "Training on the GPU (larger sizes, more tokens) is still to do: `bench/run_gpu.sh zoo-train`.",
        "",
    ]


def _calibration_lines(record: dict | None) -> list[str]:
    if not record:
        return []
    shapes = {tuple(shape) for shape in record["shapes"].values()}
    size = " or ".join(f"{n} x {length}" for n, length in sorted(shapes))
    return [
        f"Calibration windows (`zoo/{record['file']}`, read by `zoo accept`, `hsd-fast select` and the "
        f"demo): {size} tokens per source, evenly spaced over the validation tokens, rewritten by every "
        f"build from its corpus; sha256 `{record['sha256']}`.",
        "",
    ]


def _model_row(name: str, card: dict, sources: list[str]) -> list[object]:
    shape = card["shape"]
    return [
        name, shape["hidden_size"], shape["num_layers"], f"{shape['num_heads']} x {shape['head_dim']}",
        shape["intermediate_size"], f"{card['params'] / 1e6:.2f} M", card["grown_from"] or "-",
        f"{card['tokens_seen'] / 1e6:.2f} M", f"{card['train_seconds'] / 60:.1f} min", card["device"],
        *(f"{card['val_loss'].get(s, float('nan')):.3f}" for s in sources),
        f"{card['int8_argmax_agreement']:.4f}",
    ]  # fmt: skip


def _adjacent_rows(accept: dict) -> list[list[str]]:
    """Per source, each pair of adjacent sizes: sum-min at temperature 1 / greedy agreement."""
    sum_min, greedy, names = accept["sum_min_t1_per_source"], accept["greedy_per_source"], accept["models"]
    return [
        [
            f"{names[i]} -> {names[i + 1]}",
            *(f"{sum_min[s][i][i + 1]:.3f} / {greedy[s][i][i + 1]:.3f}" for s in sum_min),
        ]
        for i in range(len(names) - 1)
    ]


def _train_val(info: dict) -> tuple[str, str]:
    return f"{info['train'] / 1e6:.2f} M", f"{info['val'] / 1e3:.1f} k"
