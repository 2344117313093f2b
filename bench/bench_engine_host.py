"""The engine's own host time per round on the zoo: a round's wall time minus its time in forwards
(``HSDStats.host_time`` over the rounds), greedy, compiled steps, batch 1 and 16.

    python bench/bench_engine_host.py

Configurations: no draft, ``xxs > s`` T=2, ``lookup > s`` T=6 (a lookup round's propose, write and
commit count as that round's step time). Each runs 3 times to warm up (compiling), then 5 times;
the median of the 5 per-run means. 128 new tokens after the zoo's first code prompt (batch 16: its
first 4 code prompts, 4 times each). Writes bench/results/engine_host_cpu.{json,md}.
"""

from __future__ import annotations

import statistics

from kernel_bench import run_meta, write_results

from hsd_fast import LookupDraft, run_hsd
from hsd_fast.bench.scenarios import zoo_scenario
from hsd_fast.hf_runner import HFRunner


def main() -> None:
    zoo = zoo_scenario()
    vocab = zoo.target.get_output_embeddings().weight.shape[0]
    target, xxs = HFRunner.of(zoo.target, vocab), HFRunner.of(zoo.drafts["xxs"], vocab)
    configs = {
        "no draft": ([target], []),
        "xxs > s, T=2": ([xxs, target], [2]),
        "lookup > s, T=6": ([LookupDraft(), target], [6]),
    }
    code = list(zoo.prompt_sets["code"][:4])
    rows = []
    for batch, prompts in ((1, code[:1]), (16, code * 4)):
        for name, (runners, block_sizes) in configs.items():
            kwargs = dict(block_sizes=block_sizes, max_new_tokens=128, greedy=True, compile=True)
            for _ in range(3):
                run_hsd(runners, prompts, **kwargs)
            per_run = []
            for _ in range(5):
                stats = run_hsd(runners, prompts, **kwargs).stats
                per_run.append(1e6 * stats.host_time / sum(stats.forwards))
            rows.append({"batch": batch, "config": name, "host_us_per_round": statistics.median(per_run)})
            print(rows[-1], flush=True)
    notes = [
        "The zoo, greedy, compiled steps; host time = a round's wall time minus its time in forwards "
        "(the prefill's head chunks included in the latter), per round (lookup rounds count: their "
        "propose, write and commit are their step time). Median of 5 runs after 3 warm-up runs.",
    ]
    write_results(
        "engine_host_cpu", "Engine host time per round", notes, ["batch", "config"], rows, run_meta("cpu")
    )


if __name__ == "__main__":
    main()
