"""``hsd-fast zoo info | build | accept``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hsd_fast.zoo import card


def add_parser(sub) -> None:
    zoo = sub.add_parser("zoo", help="the committed model zoo: info, build, accept")
    zoo.add_argument("--zoo-dir", type=Path, help="default: $HSD_FAST_ZOO or the installed zoo")
    actions = zoo.add_subparsers(dest="action", required=True)
    actions.add_parser("info", help="models, sizes, training and data of the zoo")
    build = actions.add_parser("build", help="corpus -> tokenizer -> train -> int8 files (long)")
    build.add_argument("--sizes", nargs="+", default=["xxs", "xs", "sm", "s"])
    build.add_argument("--steps", type=int, help="training steps per size (default: per-size CPU budget)")
    build.add_argument("--device", default="cpu", help="cpu or cuda")
    build.add_argument("--work-dir", type=Path, default=Path.home() / ".cache" / "hsd_fast" / "zoo")
    build.add_argument("--retrain-tokenizer", action="store_true", help="replace the committed tokenizer")
    build.add_argument(
        "--tokens", type=Path, help="train on this token file (hash checked) instead of building the corpus"
    )
    accept = actions.add_parser("accept", help="pairwise acceptance matrix on held-out text")
    accept.add_argument("--write", action="store_true", help="store it in manifest.json and README.md")


def run(args: argparse.Namespace) -> int:
    from hsd_fast import zoo

    zoo_dir = args.zoo_dir or zoo.zoo_dir()
    if args.action == "build":
        from hsd_fast.zoo.build import build

        if args.retrain_tokenizer and (zoo_dir / "tokenizer").exists():
            print("retraining the tokenizer: every existing model of this zoo must be rebuilt")
        build(
            zoo_dir, args.work_dir, args.sizes, args.steps, args.device, args.retrain_tokenizer, args.tokens
        )
        _write_card(zoo_dir)
        return 0
    from hsd_fast.zoo.build import measure_acceptance, read_manifest

    manifest = read_manifest(zoo_dir)
    if not manifest.get("models"):
        print(f"no zoo models under {zoo_dir}; build them with `hsd-fast zoo build`")
        return 1
    names = sorted(manifest["models"], key=lambda n: manifest["models"][n]["params"])
    if args.action == "info":
        print(f"zoo: {zoo_dir}\n")
        print(card.render(manifest))
        return 0
    result = measure_acceptance(zoo_dir, names)
    for key in ("greedy", "sum_min_t1"):
        print(f"\n{key}:")
        print("\n".join(card.matrix_table(names, result[key])))
    if args.write:
        manifest["acceptance"] = result
        (zoo_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        _write_card(zoo_dir)
    return 0


def _write_card(zoo_dir: Path) -> None:
    from hsd_fast.zoo.build import read_manifest

    (zoo_dir / "README.md").write_text(card.render(read_manifest(zoo_dir)))
    print(f"wrote {zoo_dir / 'README.md'}")
