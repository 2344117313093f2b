"""``hsd-fast zoo info | sources | build | accept``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hsd_fast.cli_args import unwritable
from hsd_fast.zoo import card


def add_parser(sub) -> argparse.ArgumentParser:
    zoo = sub.add_parser("zoo", help="the committed model zoo: info, sources, build, accept")
    zoo.add_argument("--zoo-dir", type=Path, help="default: $HSD_FAST_ZOO or the installed zoo")
    actions = zoo.add_subparsers(dest="action", required=True)
    actions.add_parser("info", help="models, sizes, training and data of the zoo")
    sources = actions.add_parser(
        "sources", help="the corpus text `zoo build` needs: Debian package and path found, or missing"
    )
    sources.add_argument(
        "--hash", action="store_true", help="read the text and compare its sha256 with the recorded corpus's"
    )
    build = actions.add_parser("build", help="corpus -> tokenizer -> train -> int8 files (long)")
    # build.DEFAULT_SIZES (not imported here: building modules load only when a build runs)
    sizes = ["xxs", "xs", "sm", "s", "se", "sx", "xxs4k", "xs4k"]
    build.add_argument(
        "--sizes", nargs="+", default=sizes, help=f"what to train (default: {' '.join(sizes)})"
    )
    build.add_argument("--steps", type=int, help="training steps per size (default: per-size CPU budget)")
    build.add_argument("--device", default="cpu", help="cpu or cuda")
    build.add_argument(
        "--work-dir", type=Path, default=Path.home() / ".cache" / "hsd_fast" / "zoo",
        help="corpus text and token files (default: ~/.cache/hsd_fast/zoo)",
    )  # fmt: skip
    build.add_argument("--retrain-tokenizer", action="store_true", help="replace the committed tokenizers")
    build.add_argument(
        "--tokens", type=Path, help="train on this token file (hash checked) instead of building the corpus"
    )
    accept = actions.add_parser("accept", help="pairwise acceptance matrix on held-out text")
    accept.add_argument("--write", action="store_true", help="store it in manifest.json and README.md")
    accept.add_argument(
        "--exits",
        action="store_true",
        help="also the early exits of the models trained for them, and the zoo's sizes, as their drafts",
    )
    return zoo


def run(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """``parser`` (the ``zoo`` sub-command's) reports usage errors; without one they exit with
    their message."""
    from hsd_fast import zoo
    from hsd_fast.zoo.corpus import MissingSourcesError

    zoo_dir = args.zoo_dir or zoo.zoo_dir()
    if args.action == "sources":
        return _sources(zoo_dir, args.hash)
    if args.action == "build":
        from hsd_fast.zoo.build import OWN_TOKENIZER, build

        own = [size for size in args.sizes if size in OWN_TOKENIZER]
        if args.tokens is not None and own:  # --tokens carries the shared tokenizer's ids only
            message = f"--tokens: {' '.join(own)} train on another tokenizer; leave them out of --sizes"
            if parser is None:
                raise SystemExit(f"hsd-fast zoo: error: {message}")
            parser.error(message)
        if args.retrain_tokenizer and (zoo_dir / "tokenizer").exists():
            print("retraining the tokenizers: every existing model of this zoo must be rebuilt")
        try:
            build(
                zoo_dir,
                args.work_dir,
                args.sizes,
                args.steps,
                args.device,
                args.retrain_tokenizer,
                args.tokens,
            )
        except MissingSourcesError as err:
            print(err)
            return 1
        _write_card(zoo_dir)
        return 0
    from hsd_fast.zoo.build import measure_acceptance

    manifest = _read_manifest(zoo_dir)
    if not manifest.get("models"):
        print(f"no zoo models under {zoo_dir}; build them with `hsd-fast zoo build`")
        return 1
    names = sorted(manifest["models"], key=lambda n: manifest["models"][n]["params"])
    if args.action == "info":
        print(f"zoo: {zoo_dir}\n")
        print(card.render(manifest))
        return 0
    if args.write:  # before measuring: a zoo that cannot take the result fails now, not at the end
        for path in (zoo_dir / "manifest.json", zoo_dir / "README.md"):
            problem = unwritable(path)
            if problem is not None:
                message = f"accept --write: {problem}"
                if parser is None:
                    raise SystemExit(f"hsd-fast zoo: error: {message}")
                parser.error(message)
    family = [n for n in names if zoo.in_family(manifest["models"][n])]
    result = measure_acceptance(zoo_dir, family)
    for key in ("greedy", "sum_min_t1"):
        print(f"\n{key}:")
        print("\n".join(card.matrix_table(family, result[key])))
    exits = _measure_exits(zoo_dir, manifest["models"], family) if args.exits else {}
    for name, measured in exits.items():
        print(f"\nas drafts of {name}:")
        print("\n".join(card.exit_table(measured)))
    if args.write:
        manifest["acceptance"] = result
        if exits:
            manifest["exits"] = exits
        (zoo_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        _write_card(zoo_dir)
    return 0


def _measure_exits(zoo_dir: Path, models: dict, family: list[str]) -> dict[str, dict]:
    """For each model trained with an early-exit loss: its exits and the ``family`` as drafts of it;
    and, to compare, the exits of the model it was trained on from (from scratch: of the size whose
    shape it has)."""
    from hsd_fast.zoo.build import measure_exits

    exits = {}
    for name, record in models.items():
        if "exit_weights" in record["training"]:
            exits[name] = measure_exits(zoo_dir, name, family)
            parent = record["grown_from"] or record.get("variant_of")
            if parent and parent not in exits:
                exits[parent] = measure_exits(zoo_dir, parent)
    return exits


def _read_manifest(zoo_dir: Path) -> dict:
    """The zoo's manifest; one that is not JSON exits naming its path."""
    from hsd_fast.zoo.build import read_manifest

    try:
        manifest = read_manifest(zoo_dir)
    except ValueError as err:  # JSON or text decoding
        raise SystemExit(f"hsd-fast zoo: {zoo_dir / 'manifest.json'} is not a zoo manifest ({err})") from None
    if not isinstance(manifest, dict):
        raise SystemExit(
            f"hsd-fast zoo: {zoo_dir / 'manifest.json'} is not a zoo manifest (not a JSON object)"
        )
    return manifest


def _sources(zoo_dir: Path, check_hash: bool) -> int:
    """The corpus sources of this machine, one line each; 1 when one is missing."""
    from hsd_fast.zoo.corpus import SOURCES, MissingSourcesError, documents, locate_sources, text_hash

    found = locate_sources()
    rows = [("source", "Debian package", "found")]
    rows += [(name, SOURCES[name].package or "-", str(path or "missing")) for name, path in found.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    for name, package, path in rows:
        print(f"{name:<{widths[0]}}  {package:<{widths[1]}}  {path}")
    missing = [SOURCES[name] for name, path in found.items() if path is None]
    if missing:
        print(f"\n{MissingSourcesError(missing)}")
        return 1
    if check_hash:  # reads every document (~40 MB for the committed corpus)
        recorded = _read_manifest(zoo_dir).get("corpus", {}).get("text_sha256")
        digest = text_hash(list(documents()))
        verdict = "the recorded corpus" if digest == recorded else f"not the recorded corpus ({recorded})"
        print(f"\ntext sha256 {digest}: {verdict}")
    return 0


def _write_card(zoo_dir: Path) -> None:
    from hsd_fast.zoo.build import read_manifest

    (zoo_dir / "README.md").write_text(card.render(read_manifest(zoo_dir)))
    print(f"wrote {zoo_dir / 'README.md'}")
