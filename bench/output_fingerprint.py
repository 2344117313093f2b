"""Token ids of a fixed set of requests over the zoo, written as JSON: run it before and after a change
that must not alter outputs (a refactoring) and compare the two files (``--compare OLD``).

Covers greedy and seeded sampling, no draft, one and two draft models, the lookup level, a token tree,
batch 1 and a left-padded batch 4, eager steps and (``--compiled``) compiled ones.

    python bench/output_fingerprint.py --out /tmp/before.json
    python bench/output_fingerprint.py --out /tmp/after.json --compare /tmp/before.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

import hsd_fast
from hsd_fast import zoo

PROMPTS = ["def fibonacci(n):\n    ", "The license grants you", "import os\nimport sys\n", "Once upon a time"]


def requests(models: dict) -> dict:
    """name -> (drafts, T, tree)."""
    xxs, xs = models["xxs"], models["xs"]
    return {
        "none": ([], [], None),
        "xxs": ([xxs], [4], None),
        "xxs>xs": ([xxs, xs], [3, 2], None),
        "lookup": (["lookup"], [6], None),
        "lookup>xs": (["lookup", xs], [4, 3], None),
        "tree_xxs": ([xxs], None, hsd_fast.Tree.spine(3, 2)),
        "xxs_tree>xs": ([xxs, xs], None, hsd_fast.Tree.full([2, 2])),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--compare")
    parser.add_argument("--compiled", action="store_true")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    models = {name: zoo.load(name) for name in ("xxs", "xs", "s")}
    tokenizer = zoo.load_tokenizer()
    tokenizer.padding_side = "left"
    batches = {
        "b1": tokenizer(PROMPTS[:1], return_tensors="pt"),
        "b4": tokenizer(PROMPTS, return_tensors="pt", padding=True),
    }
    out = {}
    for name, (drafts, T, tree) in requests(models).items():
        for batch_name, enc in batches.items():
            for mode in ("greedy", "sampled"):
                greedy = mode == "greedy"
                sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 0.8}
                ids = models["s"].generate(
                    enc["input_ids"],
                    attention_mask=enc["attention_mask"],
                    custom_generate=hsd_fast.generate,
                    drafts=drafts,
                    T=T,
                    tree=tree,
                    seed=1234,
                    compile=args.compiled,
                    max_new_tokens=args.max_new_tokens,
                    pad_token_id=0,
                    **sampling,
                )
                key = f"{name}/{batch_name}/{mode}"
                out[key] = ids.tolist()
                print(key, ids.shape[1], flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f)
    if args.compare:
        with open(args.compare) as f:
            old = json.load(f)
        differ = sorted(k for k in old.keys() | out.keys() if old.get(k) != out.get(k))
        print(f"{len(out)} requests compared with {args.compare}: {len(differ)} differ {differ}")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
