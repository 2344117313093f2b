"""``hsd-fast bench``: the smoke run writes its result files with every field; passes are timed in
a rotated order; a pass during which other processes took the CPU is redone. No timed assertions."""

import importlib.util
import json

import pytest
from printed import table_rows, words

from hsd_fast.bench.results import figure, write
from hsd_fast.bench.timing import CpuMeter, interleaved, pass_order
from hsd_fast.cli import main

pytestmark = pytest.mark.hf


def _bench(*argv: str) -> int:
    return main(["bench", *argv])


def test_quick_bench_writes_its_files_with_every_field(tmp_path) -> None:
    assert (
        _bench("--scenario", "tiny", "--quick", "--out", str(tmp_path), "--cache", str(tmp_path / "p.json"))
        == 0
    )
    report = json.loads((tmp_path / "e2e_tiny_cpu.json").read_text())
    meta, rows = report["meta"], report["rows"]
    assert {"date", "commit", "device", "versions", "scenario", "sampling", "batches", "passes"} <= set(meta)
    families = {r["family"] for r in rows}
    assert {"hf", "hf assisted", "hf lookup", "ours"} <= families
    for row in rows:
        assert {
            "config",
            "tok_s",
            "x_hf",
            "x_ours_no_draft",
            "tokens_per_target_forward",
            "same_output",
        } <= set(row)
        assert row["tok_s"] > 0 and row["same_output"] is True, row["config"]
    ours = [r for r in rows if r["family"] == "ours"]
    markdown = (tmp_path / "e2e_tiny_cpu.md").read_text()
    # the selector's pick runs, or is named as the same hierarchy as our no-draft decoding
    assert any(r["config"] == "ours, no draft" for r in ours)
    assert len(ours) >= 2 or "selector's pick: the same hierarchy as ours, no draft" in markdown
    fixed = [r for r in ours if "adaptive" not in r["config"]]  # the adaptive engine has no prediction
    assert all(r["predicted_tok_s"] > 0 and r["measured_decode_tok_s"] > 0 for r in fixed)
    assert len(ours) - len(fixed) == 1  # the adaptive engine, beside the hierarchies it chooses among
    assert ["configuration", "tokens/s", "x HF generate"] in [row[:3] for row in table_rows(markdown)]
    assert meta["commit"] in markdown
    assert (tmp_path / "e2e_tiny_cpu.png").is_file() == (importlib.util.find_spec("matplotlib") is not None)


@pytest.mark.slow
def test_the_mixed_scenario_serves_one_stream_static_and_adaptive(tmp_path) -> None:
    argv = [
        "--scenario",
        "tiny",
        "--quick",
        "--mixed",
        "--out",
        str(tmp_path),
        "--cache",
        str(tmp_path / "p.json"),
    ]
    assert _bench(*argv, "--batch", "1", "2") == 0
    for stem in ("e2e_tiny_mixed_cpu", "e2e_tiny_mixed_b2_cpu"):
        report = json.loads((tmp_path / f"{stem}.json").read_text())
        rows = {r["config"]: r for r in report["rows"]}
        assert report["meta"]["requests"].startswith("3 x 16 prompt tokens: random, random, random > random")
        static = [c for c in rows if not c.startswith("adaptive")]
        assert "no draft" in static and any(c.startswith("static pick: ") for c in static)
        assert {"lookup > target T=6", "first1 > target T=4", "lookup > first1 > target T=6,3"} <= set(static)
        adaptive = [rows[c] for c in rows if c.startswith("adaptive")]
        assert len(adaptive) == 3  # the built-in policy, the controller with and without probes (greedy)
        assert all(0 <= r["look_share"] < 1 and r["probe_share"] is not None for r in adaptive)
        assert max(r["x_best_static"] for r in rows.values() if r["config"] in static) == 1.0
        for row in rows.values():
            assert row["tok_s"] > 0 and row["same_output"] is True, row["config"]
            assert row["random tok_s"] > 0 and row["register switches tok_s"] > 0
        assert "Best static configuration over the whole stream" in (tmp_path / f"{stem}.md").read_text()


@pytest.mark.slow
def test_a_larger_batch_gets_its_own_pick_and_predictions(tmp_path) -> None:
    """With batch 3 asked for, step costs are also timed at 3 rows (stored apart), the predictions
    in batch 3's tables come from them, and the selector's pick for batch 3 runs there only, or is
    named as the same hierarchy as a configuration that runs anyway. HF's batch-1-only
    configurations sit batch 3 out."""
    cache = tmp_path / "p.json"
    assert (
        _bench(
            "--scenario",
            "tiny",
            "--quick",
            "--batch",
            "1",
            "3",
            "--out",
            str(tmp_path),
            "--cache",
            str(cache),
        )
        == 0
    )
    rows = json.loads((tmp_path / "e2e_tiny_cpu.json").read_text())["rows"]
    at = {batch: {r["config"]: r for r in rows if r["batch"] == batch} for batch in (1, 3)}
    assert not any(r["family"] in ("hf assisted", "hf lookup") for r in at[3].values())
    entries = json.loads(cache.read_text())["entries"]
    assert sum(k.startswith("cost ") and " batch 3 " in k for k in entries) == 3  # two drafts, the target
    assert sum(k.startswith("lookup cost ") and " batch 3 " in k for k in entries) == 1
    alone = "ours, no draft"
    assert at[3][alone]["predicted_tok_s"] != pytest.approx(3 * at[1][alone]["predicted_tok_s"], rel=1e-9)
    picked = [name for name in at[3] if name.endswith("(selector's pick for batch 3)")]
    markdown = (tmp_path / "e2e_tiny_cpu.md").read_text()
    assert len(picked) == 1 or "selector's pick for batch 3: the same hierarchy as" in markdown
    assert not any(name.endswith("(selector's pick for batch 3)") for name in at[1])
    fixed = [r for r in at[3].values() if r["family"] == "ours" and "adaptive" not in r["config"]]
    assert all(r["predicted_tok_s"] > 0 for r in fixed)  # the adaptive engine has no prediction


@pytest.mark.slow
def test_profiles_measured_by_profile_only_serve_the_bench(tmp_path, monkeypatch) -> None:
    """``--profile-only`` (what a compiled bench runs in a child process first) caches everything the
    bench's selector needs, for every batch: a bench run on that cache then measures no step cost
    and adds nothing to the cache, and ``--profile-only`` writes no result files."""
    # every entry reused, however noisy this machine timed it (re-timing noisy costs: test_profile_cache)
    # and however its speed moved between the two runs (the anchor workload, timed once per run, moves
    # past ANCHOR_TOLERANCE when other tests load the machine: test_latency_model_inputs)
    monkeypatch.setattr("hsd_fast.profile.cache.MAX_REUSED_NOISE", float("inf"))
    monkeypatch.setattr("hsd_fast.profile.cache.ANCHOR_TOLERANCE", float("inf"))
    cache = tmp_path / "p.json"
    common = ["--scenario", "tiny", "--batch", "1", "2", "--do-sample", "--max-new-tokens", "32"]
    common += ["--cache", str(cache), "--out", str(tmp_path)]
    assert _bench(*common, "--eager", "--profile-only") == 0
    cached = cache.read_text()
    assert json.loads(cached)["entries"], "--profile-only cached nothing"
    assert not list(tmp_path.glob("e2e_*")), "--profile-only wrote result files"

    def measure(*_args, **_kwargs):
        raise AssertionError("step costs measured again by the bench")

    monkeypatch.setattr("hsd_fast.profile.cache.forward_costs", measure)
    assert _bench(*common, "--quick") == 0
    assert cache.read_text() == cached, "the bench measured something --profile-only had not cached"


def test_a_run_beyond_the_position_table_is_refused_before_measuring(tmp_path, capsys) -> None:
    # the tiny scenario: prompts of 16 tokens, 512 positions
    with pytest.raises(SystemExit, match=r"max_position_embeddings \(512\); use --max-new-tokens <= 496"):
        _bench("--scenario", "tiny", "--quick", "--max-new-tokens", "497", "--out", str(tmp_path))
    assert "step costs" not in capsys.readouterr().err  # nothing was profiled
    assert not list(tmp_path.iterdir())


ROWS = [  # HF assisted generation runs at batch 1 only
    {"batch": 1, "prompt_set": "code", "config": "HF generate", "tok_s": 10.0},
    {"batch": 1, "prompt_set": "code", "config": "HF assisted, xxs", "tok_s": 12.0},
    {"batch": 4, "prompt_set": "code", "config": "HF generate", "tok_s": 30.0},
]


def test_the_tables_name_a_configuration_that_runs_at_batch_1_only(tmp_path) -> None:
    write(tmp_path / "r", {"scenario": "s", "sampling_label": "greedy"}, ROWS, [])
    markdown = (tmp_path / "r.md").read_text()
    batch_1, batch_4 = (words(part) for part in markdown.split("## Batch ")[1:3])
    assert "batch 1 only" not in batch_1
    assert "HF assisted, xxs` (batch 1 only)" in batch_4


def test_the_plot_says_batch_1_only_where_a_configuration_did_not_run() -> None:
    pytest.importorskip("matplotlib")
    batch_1, batch_4 = figure("title", ROWS).axes
    assert not batch_1.texts
    (said,) = batch_4.texts
    labels = [label.get_text() for label in batch_4.get_yticklabels()]
    row = dict(zip(labels, batch_4.get_yticks(), strict=True))["HF assisted, xxs"]
    assert said.get_text().strip() == "batch 1 only" and said.get_position()[1] == row


def test_every_configuration_takes_every_place_in_the_order() -> None:
    orders = [pass_order(4, p) for p in range(4)]
    assert all(sorted(order) == [0, 1, 2, 3] for order in orders)
    assert [sorted(order[i] for order in orders) for i in range(4)] == [[0, 1, 2, 3]] * 4


def test_the_meter_counts_only_other_processes(tmp_path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  0 0 0 0 0 0 0 0 0 0\n")
    meter = CpuMeter(str(stat))
    hz, cores = meter.ticks_per_second, meter.cores

    def snapshot(wall: float, busy_s: float, own_s: float) -> tuple[float, float, float]:
        stat.write_text(f"cpu  {int(busy_s * hz)} 0 0 1000 0 0 0 0 0 0\n")
        return wall, meter.snapshot()[1], own_s  # the system's busy seconds, as read from the file

    before = snapshot(0.0, 10.0, 3.0)
    after = snapshot(2.0, 10.0 + 2.0 * cores * 0.5, 3.0 + 0.5 * cores)  # half the machine busy: ours
    assert meter.foreign_share(before, after) == pytest.approx(0.25, abs=0.01)


class _ScriptedMeter:
    """Reports the given foreign shares, one per pass attempt."""

    available = True

    def __init__(self, shares: list[float]) -> None:
        self.shares, self.calls = shares, 0

    def snapshot(self):
        return 0.0, 0.0, 0.0

    def foreign_share(self, before, after) -> float:
        self.calls += 1
        return self.shares[self.calls - 1]


def test_a_contended_pass_is_redone_and_counted() -> None:
    ran: list[str] = []
    runs = [lambda: ran.append("a"), lambda: ran.append("b")]
    timings = interleaved(runs, passes=2, meter=_ScriptedMeter([0.0, 0.5, 0.02]))
    assert timings.redone == 1
    assert len(timings.seconds[0]) == len(timings.seconds[1]) == 2  # only the kept passes count
    assert ran == [*"ab", *"ab", *"ba", *"ba"]  # warm-up, pass 1, pass 2 (rotated) twice
    assert timings.foreign_shares == [0.0, 0.02]


def test_a_pass_that_stays_contended_is_kept_after_the_last_redo() -> None:
    timings = interleaved([lambda: None], passes=1, meter=_ScriptedMeter([0.9] * 4), max_redos=3)
    assert timings.redone == 3 and timings.foreign_shares == [0.9]


def test_warm_up_lasts_until_nothing_compiles_and_a_pass_that_compiles_is_redone() -> None:
    """A configuration compiles during its first two calls (a shape at its third use, say) and once
    more during the first counted pass: it is warmed up until a call compiles nothing, and the
    counted pass that compiled is redone and counted apart from busy passes."""
    compiled_at = {1, 2, 4}  # calls (1-based) that compile something
    calls: list[int] = []
    graphs = [0]

    def run() -> None:
        calls.append(len(calls) + 1)
        graphs[0] += len(calls) in compiled_at

    timings = interleaved([run], passes=2, meter=_ScriptedMeter([0.0] * 4), compiled=lambda: graphs[0])
    assert len(calls) == 6  # 3 warm-up calls, pass 1 twice (its first try compiled), pass 2
    assert timings.recompiled == 1 and timings.redone == 0
    assert len(timings.seconds[0]) == 2


def test_grid_kinds_name_the_early_exit_hierarchies() -> None:
    """The `exits` scenario's report compares the best hierarchy with an exit level and without."""
    from types import SimpleNamespace

    from hsd_fast.bench.command import GRID_KINDS, _grid_kinds

    names = ["lookup", "xxs", "exit2", "target"]
    kinds = _grid_kinds(SimpleNamespace(exits={"exit2": 2}, drafts={}), names)
    assert kinds["best with an early exit"]((0, 2, 3)) and not kinds["best without an early exit"]((0, 2, 3))
    assert kinds["best without an early exit"]((0, 1, 3)) and not kinds["best with an early exit"]((1, 3))
    assert kinds["best single early exit"]((2, 3)) and not kinds["best single early exit"]((1, 3))
    assert "best single early exit, recomputed" not in kinds  # no twin: the exit cannot reuse
    assert _grid_kinds(SimpleNamespace(exits={}, drafts={}), names) is GRID_KINDS
    # with the exit's recomputing twin among the candidates, both ways are kinds of their own
    twins = _grid_kinds(
        SimpleNamespace(exits={"exit2": 2}, drafts={}), [*names[:3], "exit2 (recompute)", "target"]
    )
    assert twins["best single early exit"]((3, 4)) and twins["best with an early exit"]((0, 3, 4))
    assert twins["best single early exit, reused"]((2, 4)) and not twins["best single early exit, reused"](
        (3, 4)
    )
    assert twins["best single early exit, recomputed"]((3, 4)) and not twins["best without an early exit"](
        (3, 4)
    )


def test_the_tokenizers_scenario_compares_hierarchies_with_and_without_a_bridged_draft() -> None:
    """A draft with another tokenizer is candidate 1 (after the lookup level): the report's kinds
    name the best with it and without, and the adaptive engine's profile leaves it out."""
    from types import SimpleNamespace

    from hsd_fast.bench.command import BenchProfile, _adaptive_profile, _grid_kinds
    from hsd_fast.latency import RatesThrough
    from hsd_fast.other_tokenizer import OtherTokenizerDraft

    bridged = object.__new__(OtherTokenizerDraft)  # only its type is read here
    scenario = SimpleNamespace(exits={}, drafts={"xs4k": bridged, "xs": None})
    names = ["lookup", "xs4k", "xs", "target"]
    kinds = _grid_kinds(scenario, names)
    assert kinds["best with another tokenizer"]((1, 3)) and not kinds["best with another tokenizer"]((2, 3))
    assert kinds["best without another tokenizer"]((0, 2, 3))
    costs, alpha = [0.1, 0.2, 0.3, 1.0], [[i * 4 + j for j in range(4)] for i in range(4)]
    spread = [[float(i + j) for j in range(4)] for i in range(4)]
    through = {(0, 2, 3): RatesThrough(0.9, 0.3), (0, 1, 3): RatesThrough(0.8)}  # (lookup, xs, target) kept
    kept = _adaptive_profile(scenario, BenchProfile(costs, alpha, names, spread, through))
    kept_rows = [[0, 2, 3], [8, 10, 11], [12, 14, 15]]
    kept_spread = [[0, 2, 3], [2, 4, 5], [3, 5, 6]]
    assert kept == (
        [0.1, 0.3, 1.0],
        kept_rows,
        ["lookup", "xs", "target"],
        kept_spread,
        {(0, 1, 2): through[(0, 2, 3)]},
    )
    assert _adaptive_profile(scenario, BenchProfile(costs, alpha, names, None, {})).spread is None  # batch 1


def test_an_exits_recomputing_twin_runs_by_its_name_and_sits_out_adaptive_runs() -> None:
    """The `exits` scenario's profile names an exit's recomputing twin ``exitK (recompute)``: a chain
    naming it runs ``EarlyExit(target, k, reuse=False)`` (its output the target's all the same), and
    the adaptive engine's profile leaves it out (an adaptive run recomputes every exit)."""
    from types import SimpleNamespace

    import torch
    from hf_models import tiny_model

    from hsd_fast.bench import configs as cfg
    from hsd_fast.bench.command import BenchProfile, _adaptive_profile, _drafts
    from hsd_fast.early_exit import EarlyExit

    target = tiny_model("llama", layers=4)
    scenario = SimpleNamespace(target=target, exits={"exit2": 2}, drafts={"exit2": EarlyExit(target, 2)})
    names = ["lookup", "exit2", "exit2 (recompute)", "target"]
    levels = _drafts(scenario, names[:-1])
    assert levels[1:] == (EarlyExit(target, 2), EarlyExit(target, 2, reuse=False))
    with pytest.raises(KeyError):
        _drafts(scenario, ["exit3 (recompute)"])  # not an exit of the scenario's
    costs, alpha = [0.1, 0.2, 0.2, 1.0], [[i * 4 + j for j in range(4)] for i in range(4)]
    assert _adaptive_profile(scenario, BenchProfile(costs, alpha, names, None, {})).names == [
        "lookup",
        "exit2",
        "target",
    ]
    config = cfg.ours(
        target,
        dict(zip(names[:-1], levels, strict=True)),
        ["exit2 (recompute)"],
        (3,),
        {"do_sample": False},
        12,
        False,
    )
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    sequences, stats = config.generate(ids, torch.ones_like(ids))
    expected = target.generate(ids, do_sample=False, max_new_tokens=12, eos_token_id=None, pad_token_id=0)
    assert sequences.tolist() == expected.tolist()
    assert stats.verified[1] > 0


@pytest.mark.slow
def test_a_checkpoints_generation_config_runs_every_configuration(tmp_path) -> None:
    """``--generation-config qwen2.5-instruct``: every configuration samples with Qwen2.5-Instruct's
    shipped defaults (repetition penalty included), in its own result files."""
    argv = ["--scenario", "tiny", "--quick", "--out", str(tmp_path), "--cache", str(tmp_path / "p.json")]
    assert _bench(*argv, "--generation-config", "qwen2.5-instruct") == 0
    report = json.loads((tmp_path / "e2e_tiny_qwen2.5-instruct_cpu.json").read_text())
    assert report["meta"]["sampling"]["repetition_penalty"] == 1.05
    assert report["meta"]["sampling_label"] == "temperature 0.7, top p 0.8, top k 20, repetition penalty 1.05"
    assert all(r["tok_s"] > 0 for r in report["rows"])
    assert {"hf", "ours"} <= {r["family"] for r in report["rows"]}
