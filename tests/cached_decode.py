"""One process of ``test_graph_cache.py``: for each seed, builds a tiny model from it, decodes with
compiled steps (no draft) and prints a JSON line: HSD's tokens, HF's greedy tokens, what
inductor's FX graph cache did for the run's steps, the seconds they took to compile and the key
``compile_price`` records them under. With ``--plant``, under
``planted_bugs.weights_keyed_on_shapes``."""

from __future__ import annotations

import argparse
import contextlib
import json
import types

import torch
from hf_models import tiny_model
from planted_bugs import weights_keyed_on_shapes

import hsd_fast
from hsd_fast import compile_price
from hsd_fast.compile_policy import compile_seconds

PROMPT = [[5, 9, 11, 40, 3, 17]]


def decode(seed: int) -> dict:
    target = tiny_model("llama", layers=2, seed=seed)
    ids = torch.tensor(PROMPT)
    kwargs = {"do_sample": False, "max_new_tokens": 24, "eos_token_id": None}
    expected = target.generate(ids, **kwargs)
    counters = torch._dynamo.utils.counters
    counters.clear()
    compiling_before = compile_seconds()
    out = target.generate(ids, custom_generate=hsd_fast.generate, compile=True, **kwargs)
    inductor = counters["inductor"]
    key = compile_price.hierarchy_key([types.SimpleNamespace(model=target)], ())  # no draft: no block sizes
    return {
        "seed": seed, "tokens": out.tolist(), "expected": expected.tolist(),
        "hits": inductor["fxgraph_cache_hit"], "misses": inductor["fxgraph_cache_miss"],
        "bypasses": inductor["fxgraph_cache_bypass"],
        "packed": inductor["mkldnn_linear_weight_pack_matcher_count"],
        "compile_seconds": compile_seconds() - compiling_before, "key": key,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("seeds", type=int, nargs="+")
    parser.add_argument("--plant", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)  # beside the other test worker
    with weights_keyed_on_shapes() if args.plant else contextlib.nullcontext():
        for seed in args.seeds:
            print(json.dumps(decode(seed)), flush=True)


if __name__ == "__main__":
    main()
