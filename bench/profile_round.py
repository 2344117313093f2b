"""Where a decoding round's time goes: per level, a round's wall time, the part inside its compiled
step (forward, transform, op, and the host sync that ends it) and the engine's host work around it;
the floor that streaming the target's weights sets (every linear layer's matrix-vector product at
batch 1, replayed from one CUDA graph); and a torch.profiler table of one run per configuration.
Greedy, compiled steps, batch 1, one 768-token prompt, 128 new tokens, the zoo in fp32 with ``s``
optionally replaced by its cost twin.

    python bench/profile_round.py [--twin 2048 8 8192] [--out DIR]

Prints the rows and writes DIR/profile_round.json and DIR/profile_<config>.txt (default DIR:
bench/results/profile_round_<device>). A row's ``rounds`` are the level's forward passes
(``HSDStats.forwards``): a draft step that draws T tokens counts T, so its per-round times are per
drafted token.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from bench_attention_e2e import load_models, prompts_of
from torch.profiler import ProfilerActivity, profile

from hsd_fast.engine import run_hsd
from hsd_fast.hf_runner import HFRunner
from hsd_fast.report import run_metadata
from hsd_fast.stats import HSDStats

CONFIGS = {"no draft": ((), []), "xs > s, T=3": (("xs",), [3])}


def weight_stream_ms(model: torch.nn.Module, repeats: int = 50) -> float | None:
    """Milliseconds to read every linear weight of ``model`` once (a batch-1 matrix-vector product
    each, from one CUDA graph): the floor of a 1-token forward bound by its weights. CUDA only."""
    if not torch.cuda.is_available():
        return None
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(1, w.shape[1], device="cuda") for w in weights]

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--twin", type=int, nargs=3, metavar=("HIDDEN", "LAYERS", "MLP"))
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out_dir = args.out or Path(f"bench/results/profile_round_{device}")
    out_dir.mkdir(parents=True, exist_ok=True)
    models = load_models(("xs", "s"), device, args.twin)
    vocab = models["s"].config.vocab_size
    prompts = [p.to(device) for p in prompts_of(768, 1)]
    floor = weight_stream_ms(models["s"])
    print(f"target weight-stream floor: {floor} ms", flush=True)
    rows = []
    for name, (drafts, block_sizes) in CONFIGS.items():
        runners = [HFRunner(models[d], vocab) for d in (*drafts, "s")]
        kwargs = dict(block_sizes=block_sizes, max_new_tokens=args.new_tokens, greedy=True, compile=True)
        for _ in range(2):  # compiles, then records the graphs
            run_hsd(runners, prompts, **kwargs)
        per_run = [run_hsd(runners, prompts, **kwargs).stats for _ in range(args.runs)]
        for level in range(len(runners)):
            wall, step = (_ms_per_round(per_run, field, level) for field in ("wall_time", "step_time"))
            rows.append({
                "config": name, "level": level, "rounds": per_run[0].forwards[level],
                "wall_ms_per_round": wall, "step_ms_per_round": step, "host_ms_per_round": wall - step,
            })  # fmt: skip
            print(rows[-1], flush=True)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=activities) as prof:
            run_hsd(runners, prompts, **kwargs)
        averages = prof.key_averages()
        tables = [averages.table(sort_by="self_cpu_time_total", row_limit=25)]
        if device == "cuda":
            tables.insert(0, averages.table(sort_by="self_cuda_time_total", row_limit=25))
        slug = name.split(",")[0].replace(" > ", "_").replace(" ", "_")
        (out_dir / f"profile_{slug}.txt").write_text("\n\n".join(tables))
    meta = run_metadata(
        device, models="zoo xs, s (fp32)" + (f"; s as its cost twin {args.twin}" if args.twin else "")
    )
    result = {"meta": meta, "weight_stream_floor_ms": floor, "rows": rows}
    (out_dir / "profile_round.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
