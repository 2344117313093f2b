"""``hsd-fast bench``: the smoke run writes its result files with every field; passes are timed in
a rotated order; a pass during which other processes took the CPU is redone. No timed assertions."""

import argparse
import importlib.util
import json

import pytest

from hsd_fast.bench import command
from hsd_fast.bench.timing import CpuMeter, interleaved, pass_order

pytestmark = pytest.mark.hf


def _bench(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    return command.run(parser.parse_args(["bench", *argv]))


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
    assert all(r["predicted_tok_s"] > 0 and r["measured_decode_tok_s"] > 0 for r in ours)
    assert "| configuration | tokens/s | x HF generate |" in markdown and meta["commit"] in markdown
    assert (tmp_path / "e2e_tiny_cpu.png").is_file() == (importlib.util.find_spec("matplotlib") is not None)


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
    assert (
        sum(k.startswith("cost ") and k.endswith(" batch 3") for k in entries) == 3
    )  # two drafts and the target
    assert sum(k.startswith("lookup cost ") and k.endswith(" batch 3") for k in entries) == 1
    alone = "ours, no draft"
    assert at[3][alone]["predicted_tok_s"] != pytest.approx(3 * at[1][alone]["predicted_tok_s"], rel=1e-9)
    picked = [name for name in at[3] if name.endswith("(selector's pick for batch 3)")]
    markdown = (tmp_path / "e2e_tiny_cpu.md").read_text()
    assert len(picked) == 1 or "selector's pick for batch 3: the same hierarchy as" in markdown
    assert not any(name.endswith("(selector's pick for batch 3)") for name in at[1])
    assert all(r["predicted_tok_s"] > 0 for r in at[3].values() if r["family"] == "ours")


def test_profiles_measured_in_a_child_process_are_read_from_the_cache(tmp_path, monkeypatch) -> None:
    """The child process (``--profile-only``, the command line ``_profile_in_child`` builds) fills the
    cache with everything ``_profile`` needs, for every batch: the parent then measures nothing."""
    args = command._check(
        argparse.Namespace(
            scenario="tiny", quick=True, eager=False, batch=[1, 2], do_sample=True, temperature=0.8,
            max_new_tokens=None, passes=None, prompts_per_set=None, out=tmp_path, cache=tmp_path / "p.json",
            profile_only=False,
        )
    )  # fmt: skip
    command._profile_in_child(args)
    cached = args.cache.read_text()
    assert json.loads(cached)["entries"], "the child cached nothing"

    def measure(*_args, **_kwargs):
        raise AssertionError("step costs measured again in the parent")

    monkeypatch.setattr("hsd_fast.profile.cache.forward_costs", measure)
    scenario = command.SCENARIOS["tiny"]()
    sampling = {"do_sample": True, "temperature": 0.8}
    for batch in (1, 2):
        costs, alpha, names = command._profile(scenario, sampling, args, batch)
        assert len(costs) == len(names) and len(alpha) == len(names)
    assert args.cache.read_text() == cached, "the parent measured something the child had not cached"
    assert not list(tmp_path.glob("e2e_*")), "--profile-only wrote result files"


def test_a_run_beyond_the_position_table_is_refused_before_measuring(tmp_path, capsys) -> None:
    # the tiny scenario: prompts of 16 tokens, 512 positions
    with pytest.raises(SystemExit, match=r"max_position_embeddings \(512\); use --max-new-tokens <= 496"):
        _bench("--scenario", "tiny", "--quick", "--max-new-tokens", "497", "--out", str(tmp_path))
    assert "step costs" not in capsys.readouterr().err  # nothing was profiled
    assert not list(tmp_path.iterdir())


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
        return wall, meter._busy_seconds(), own_s

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
