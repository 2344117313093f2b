"""Where a decoding round's time goes: per level, a round's wall time, the part inside its compiled
step (forward, transform, op, and the host sync that ends it) and the engine's host work around it;
the GPU's busy share of a run (the union of its kernels' intervals over the run's wall time); the
floor that streaming the target's weights sets (every linear layer's matrix-vector product at batch
1, replayed from one CUDA graph); and a torch.profiler table of one run per configuration. Greedy,
compiled steps, batch 1, 128 new tokens.

    python bench/profile_round.py [--twin 2048 8 8192] [--out DIR]
    python bench/profile_round.py --family [--attention dense fused] [--budget 420] [--out DIR]

Without ``--family``: the zoo in fp32, one 768-token prompt, ``s`` optionally replaced by its cost
twin. With ``--family``: the family at real shapes in bf16 (``bench_family.load_family``: the target
an 8B-shaped twin, ``sm`` a 1B-shaped one), one 512-token prompt; ``--small --eager`` is a quick CPU
check of the script. ``--attention``: the runners' attention paths to profile (dense masks, the
tree-attention kernel; docs/design.md, "Tree attention"). No configuration starts after ``--budget``
seconds, and the results are rewritten after each one, so a run cut off keeps what it measured.

Writes DIR/profile_round.json and DIR/profile_tables.txt (every configuration's profiler tables, one
file: a GPU call returns few files; default DIR: bench/results/profile_round[_family]_<device>). A
row's ``rounds`` are the level's forward passes (``HSDStats.forwards``): a draft step that draws T
tokens counts T, so its per-round times are per drafted token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from bench_attention_e2e import load_models, prompts_of
from bench_family import load_family

from hsd_fast.bench.gpu_busy import kernel_tables, profiled
from hsd_fast.engine import run_hsd
from hsd_fast.hf_runner import HFRunner
from hsd_fast.profile.costs import synchronize
from hsd_fast.report import run_metadata
from hsd_fast.stats import HSDStats

# name -> (drafts, block sizes); the target is the last level
CONFIGS = {"no draft": ((), []), "xs > s, T=3": (("xs",), [3])}
FAMILY_CONFIGS = {
    "no draft": ((), []),
    "xs > target, T=4": (("xs",), [4]),
    "xs > sm > target, T=[2, 4]": (("xs", "sm"), [2, 4]),
}


def weight_stream_ms(model: torch.nn.Module, repeats: int = 50) -> float | None:
    """Milliseconds to read every linear weight of ``model`` once (a batch-1 matrix-vector product
    each, from one CUDA graph): the floor of a 1-token forward bound by its weights. CUDA only."""
    if not torch.cuda.is_available():
        return None
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(1, w.shape[1], device="cuda", dtype=w.dtype) for w in weights]

    def products() -> None:
        for x, w in zip(inputs, weights, strict=True):
            torch.mm(x, w.t())

    products()  # cuBLAS picks its kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        products()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def _ms_per_round(runs: list[HSDStats], field: str, level: int) -> float:
    """The median over ``runs`` of ``level``'s ``field`` (seconds) per forward pass, in ms."""
    return statistics.median(1e3 * getattr(s, field)[level] / s.forwards[level] for s in runs)


class RoundProfile:
    """Profiles the configurations one by one and rewrites its files after each."""

    def __init__(self, args: argparse.Namespace, device: str) -> None:
        self.args, self.device, self.started = args, device, time.perf_counter()
        self.out = args.out or Path(f"bench/results/profile_round{'_family' * args.family}_{device}")
        self.out.mkdir(parents=True, exist_ok=True)
        if args.family:
            self.models = load_family(device, args.small)
            context, described = args.context or 512, "the family at real shapes, bf16 (bench_family.py)"
        else:
            self.models = load_models(("xs", "s"), device, args.twin)
            self.models["target"] = self.models.pop("s")
            context = args.context or 768
            described = "zoo xs, s (fp32)" + (f"; s as its cost twin {args.twin}" if args.twin else "")
        self.prompts = [p.to(device) for p in prompts_of(context, 1)]
        self.floor = weight_stream_ms(self.models["target"])
        print(f"target weight-stream floor: {self.floor} ms", flush=True)
        self.meta = run_metadata(device, models=described, context=context, new_tokens=args.new_tokens)
        self.rows: list[dict] = []
        self.summaries: list[dict] = []
        self.tables: list[str] = []
        # one runner per (model, attention path), kept across configurations: a runner keeps its
        # compiled steps, and a new one would compile them anew (minutes for the 8B-shaped target)
        self.runners: dict[tuple[str, str], HFRunner] = {}

    def runner(self, name: str, attention: str) -> HFRunner:
        if (name, attention) not in self.runners:
            vocab = self.models["target"].config.vocab_size
            self.runners[name, attention] = HFRunner(self.models[name], vocab, attention)
        return self.runners[name, attention]

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def run(self, name: str, drafts: tuple[str, ...], block_sizes: list[int], attention: str) -> None:
        runners = [self.runner(d, attention) for d in (*drafts, "target")]
        new_tokens, compiled = self.args.new_tokens, not self.args.eager
        kwargs = dict(block_sizes=block_sizes, max_new_tokens=new_tokens, greedy=True, compile=compiled)

        def generate() -> HSDStats:
            return run_hsd(runners, self.prompts, **kwargs).stats

        for _ in range(2):  # compiles, then records the graphs
            generate()
        per_run, walls = [], []
        for _ in range(self.args.runs):
            synchronize(torch.device(self.device))
            start = time.perf_counter()
            per_run.append(generate())
            synchronize(torch.device(self.device))
            walls.append(time.perf_counter() - start)
        for level in range(len(runners)):
            wall, step = (_ms_per_round(per_run, field, level) for field in ("wall_time", "step_time"))
            self.rows.append({
                "config": name, "attention": attention, "level": level, "rounds": per_run[0].forwards[level],
                "wall_ms_per_round": wall, "step_ms_per_round": step, "host_ms_per_round": wall - step,
            })  # fmt: skip
            print(self.rows[-1], flush=True)
        prof, busy = profiled(generate, torch.device(self.device))
        wall_s = statistics.median(walls)
        summary = {
            "config": name, "attention": attention, "wall_ms": 1e3 * wall_s,
            "ms_per_token": 1e3 * wall_s / self.args.new_tokens,
            "gpu_busy_ms": busy and 1e3 * busy.kernels_s,
            # over the unprofiled runs' wall time, and over the profiled run's own
            "busy_share": busy and busy.share_of(wall_s),
            "busy_share_profiled": busy and busy.share_of(busy.window_s),
        }  # fmt: skip
        self.summaries.append(summary)
        print(summary, flush=True)
        tables = kernel_tables(prof, cuda=self.device == "cuda")
        self.tables.append(f"## {name}, attention {attention}\n\n{tables}")

    def write(self) -> None:
        meta = self.meta | {"elapsed_s": round(self.elapsed())}
        result = {"meta": meta, "weight_stream_floor_ms": self.floor}
        result |= {"runs": self.summaries, "rows": self.rows}
        (self.out / "profile_round.json").write_text(json.dumps(result, indent=1, default=str))
        (self.out / "profile_tables.txt").write_text("\n\n\n".join(self.tables))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--twin", type=int, nargs=3, metavar=("HIDDEN", "LAYERS", "MLP"))
    parser.add_argument("--family", action="store_true", help="the family at real shapes in bf16")
    parser.add_argument("--small", action="store_true", help="with --family: tiny twins (a CPU check)")
    parser.add_argument("--eager", action="store_true", help="our steps not compiled (a quick CPU check)")
    parser.add_argument("--attention", nargs="+", choices=["dense", "fused"], default=["dense"])
    parser.add_argument("--context", type=int, help="prompt tokens (default 768; 512 with --family)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--budget", type=float, default=420.0, help="seconds: no configuration starts after")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.twin and args.family:
        parser.error("--twin grows the zoo's s; --family builds its own twins")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    bench = RoundProfile(args, device)
    configs = FAMILY_CONFIGS if args.family else CONFIGS
    for name, (drafts, block_sizes) in configs.items():  # each attention path in turn: compared early
        for attention in args.attention:
            if bench.elapsed() > args.budget:
                print(f"[{bench.elapsed():.0f} s] budget spent: {name} ({attention}) and later not run")
                bench.write()
                return
            try:
                bench.run(name, drafts, block_sizes, attention)
            except Exception as err:  # the file says which configuration failed and why
                bench.summaries.append({"config": name, "attention": attention, "error": repr(err)[:300]})
                print(f"failed {name} ({attention}): {err!r}"[:2000], flush=True)
            bench.write()
            print(f"[{bench.elapsed():.0f} s] {name} ({attention}) done", flush=True)


if __name__ == "__main__":
    main()
