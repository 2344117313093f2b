"""End to end, the fused tree-attention kernel against the dense-mask path (CUDA): HF ``generate`` and
our decoding with no draft, chains (``xxs > s`` and ``xs > s``, T=3; ``lookup > xs > s``, T=[1, 3])
and a tree (``full([2, 2])`` drafted by ``xxs``), each with the dense mask (SDPA) and with the
kernel, on the zoo in fp32, greedy, eager steps. One process, a warm-up pass, then passes in
rotated order; every greedy output is compared with HF's own, token for token.

    python bench/bench_attention_e2e.py [--batch 1 8] [--context 64 768] [--passes 3] [--compiled]
                                        [--twin HIDDEN LAYERS MLP] [--only dense]

``--only`` keeps our configurations whose name contains one of its strings (HF ``generate`` always
runs: it is the reference).

Writes bench/results/attention_e2e[_twin][_compiled]_<device>.{json,md}.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from hsd_fast import zoo
from hsd_fast.engine import run_hsd
from hsd_fast.hf_runner import HFRunner
from hsd_fast.lookup import LOOKUP, LookupDraft
from hsd_fast.report import markdown_table, run_metadata, write_report
from hsd_fast.tree import Tree
from hsd_fast.zoo.calibration import read_calibration

HIERARCHIES = {"no draft": ((), [], None), "xxs > s, T=3": (("xxs",), [3], None)}
HIERARCHIES["xxs > s, tree full([2, 2])"] = (("xxs",), [3], Tree.full([2, 2]))
HIERARCHIES["xs > s, T=3"] = (("xs",), [3], None)
HIERARCHIES["lookup > xs > s, T=[1, 3]"] = ((LOOKUP, "xs"), [1, 3], None)


def prompts_of(context: int, count: int) -> list[torch.Tensor]:
    """``count`` prompts of ``context`` tokens cut from the held-out calibration text."""
    stream = torch.cat([w.reshape(-1) for w in read_calibration(zoo.zoo_dir()).values()])
    stream = stream.repeat(-(-context * count // len(stream)))  # long prompts for many rows: wrap around
    return [stream[i * context : (i + 1) * context] for i in range(count)]


def load_models(names: tuple[str, ...], device: str, twin: list[int] | None) -> dict[str, torch.nn.Module]:
    """The zoo models ``names`` in fp32 on ``device``; ``twin`` (hidden, layers, MLP): ``s`` replaced
    by its cost twin of that shape (same logits, a larger model's cost; docs/design.md, "Cost twins")."""
    models = {name: zoo.load(name, torch.float32, device) for name in names}
    if twin:  # a target bound by its weights, as real ones are on a GPU
        models["s"] = zoo.cost_twin(models["s"].cpu(), *twin).to(device)
    return models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--context", type=int, nargs="+", default=[64, 768])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--compiled", action="store_true", help="our steps compiled (CUDA graphs on CUDA)")
    parser.add_argument("--only", nargs="+", help="only our configurations whose name contains one of these")
    parser.add_argument(
        "--twin", type=int, nargs=3, metavar=("HIDDEN", "LAYERS", "MLP"),
        help="replace the target s by its cost twin of this shape (same logits, a larger model's cost)",
    )  # fmt: skip
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    models = load_models(("xxs", "xs", "s"), device, args.twin)
    target, vocab = models["s"], models["s"].config.vocab_size
    eos = target.generation_config.eos_token_id

    def ours(path: str, drafts: tuple, T: list, tree: Tree | None):
        runners = [LookupDraft() if d == LOOKUP else HFRunner(models[d], vocab, path) for d in (*drafts, "s")]

        def run(prompts: list[torch.Tensor]) -> list[list[int]]:
            out = run_hsd(
                runners, prompts, block_sizes=T, max_new_tokens=args.new_tokens, eos_token_id=eos,
                greedy=True, compile=args.compiled, tree=tree,
            )  # fmt: skip
            return [s[len(p) :].tolist() for s, p in zip(out.sequences, prompts, strict=True)]

        return run

    def hf(prompts: list[torch.Tensor]) -> list[list[int]]:
        ids = torch.stack(prompts).to(device)
        out = target.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens, do_sample=False,
            pad_token_id=eos,
        )  # fmt: skip
        new = []
        for row in out[:, ids.shape[1] :].tolist():  # HF pads a finished row: cut after its EOS
            new.append(row[: row.index(eos) + 1] if eos in row else row)
        return new

    configs = {"HF generate": hf}
    for label, (drafts, T, tree) in HIERARCHIES.items():
        for path in ("dense", "fused"):
            name = f"ours, {label}, {path}"
            if not args.only or any(part in name for part in args.only):
                configs[name] = ours(path, drafts, T, tree)

    rows = []
    for context in args.context:
        for batch in args.batch:
            prompts = [p.to(device) for p in prompts_of(context, batch)]
            reference = hf(prompts)
            times: dict[str, list[float]] = {name: [] for name in configs}
            equal = dict.fromkeys(configs, True)
            errors: dict[str, str] = {}  # a configuration that fails is reported, and the rest measured
            names = list(configs)
            for k in range(args.passes + 1):  # pass 0 warms up
                for name in names[k % len(names) :] + names[: k % len(names)]:
                    if name in errors:
                        continue
                    _synchronize(device)
                    start = time.perf_counter()
                    try:
                        out = configs[name](prompts)
                    except Exception as err:  # the report says which failed and why
                        errors[name] = f"{type(err).__name__}: {err}"[:300]
                        print(f"failed {name}: {type(err).__name__}: {err}"[:3000], flush=True)
                        continue
                    _synchronize(device)
                    if k:
                        times[name].append(time.perf_counter() - start)
                    equal[name] &= out == reference
                    if not k:  # the warm-up's outcome at once: a run cut short still says it
                        print(
                            f"warm-up {name}: {time.perf_counter() - start:.1f} s, equal {out == reference}",
                            flush=True,
                        )
            tokens = sum(len(r) for r in reference)
            hf_seconds = sorted(times["HF generate"])[len(times["HF generate"]) // 2]
            for name in names:
                row = {"context": context, "batch": batch, "config": name}
                if name in errors:
                    row |= {"tok_s": None, "x_hf": None, "equal_to_hf": errors[name]}
                else:
                    seconds = sorted(times[name])[len(times[name]) // 2]
                    row |= {
                        "tok_s": tokens / seconds,
                        "x_hf": hf_seconds / seconds,
                        "equal_to_hf": equal[name],
                    }
                rows.append(row)
                print(row, flush=True)
            _write(rows, device, args)  # after every group: a run cut short keeps what it measured


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _write(rows: list[dict], device: str, args: argparse.Namespace) -> None:
    meta = run_metadata(
        device,
        models="zoo xxs, xs, s (fp32)"
        + (f"; s as its cost twin {args.twin} (hidden, layers, MLP)" if args.twin else ""),
        new_tokens=args.new_tokens,
        passes=args.passes,
        compiled=args.compiled,
    )
    columns = ["context", "batch", "config", "tok_s", "x_hf", "equal_to_hf"]
    table = markdown_table(columns, [[r[c] for c in columns] for r in rows])
    steps = "compiled steps (CUDA graphs on CUDA)" if args.compiled else "eager steps"
    notes = [f"Greedy, {steps}, medians over the passes; `equal_to_hf`: every output equals HF's greedy one."]
    twin = "_twin" if args.twin else ""
    stem = Path(f"bench/results/attention_e2e{twin}{'_compiled' * args.compiled}_{device}")
    title = f"Fused attention end to end: {meta['device']}"
    write_report(stem, title, meta, [*notes, "", *table], {"rows": rows})


if __name__ == "__main__":
    main()
