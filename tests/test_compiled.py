"""Compiled level steps (``compile=True``): the same tokens as HF's greedy decoding and as the eager
steps, the target's distribution when sampling, no graph break, and no recompilation for new
prompt lengths or ``max_new_tokens`` once the step shapes are warm. Slow (compiles graphs)."""

import itertools

import pytest
import torch
import torch._dynamo
from hf_models import derived_drafts, noisy_copy, tiny_model

import hsd_fast
from hsd_fast import compile_policy
from hsd_fast.testing.exactness import pooled_chi_square

pytestmark = [pytest.mark.hf, pytest.mark.slow]

PROMPTS = [[5, 9, 11, 40, 3], [8, 9, 10, 11, 12, 13, 14, 15, 16], [70, 71]]


def _compiles() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.fixture(scope="module")
def models() -> tuple[torch.nn.Module, list[torch.nn.Module]]:
    target = tiny_model("llama", layers=2)
    return target, derived_drafts(target, 1)


def test_compiled_greedy_equals_hf_without_recompiling_for_new_requests(models) -> None:
    """Requests of other prompt lengths and max_new_tokens (one batch size, one T: each of those is
    a new step shape, compiled once) reuse what the first ones compiled."""
    target, drafts = models
    requests = [(PROMPTS[0], 12), (PROMPTS[1], 20), (PROMPTS[2], 9), (PROMPTS[0][:3], 30)]
    torch._dynamo.utils.counters.clear()
    for round_ in range(2):
        if round_ == 1:
            warm = _compiles()
        for prompt, new in requests:
            ids = torch.tensor([prompt])
            kwargs = {"do_sample": False, "max_new_tokens": new, "eos_token_id": None}
            expected = target.generate(ids, **kwargs)
            out = target.generate(
                ids, custom_generate=hsd_fast.generate, drafts=drafts, T=[2], compile=True, **kwargs
            )
            assert out.tolist() == expected.tolist(), (prompt, new)
    assert warm > 0, "nothing was compiled"
    assert _compiles() == warm, "a new prompt length or max_new_tokens compiled a new graph"
    assert not torch._dynamo.utils.counters["graph_break"]


def test_compiled_sampling_matches_the_target_distribution() -> None:
    vocab, steps, samples = 6, 2, 3000
    target = tiny_model("llama", vocab_size=vocab, layers=2, lm_head_scale=4.0)
    drafts = [noisy_copy(target, 0.4, seed=1)]
    prompt = torch.tensor([3, 4, 5, 1])
    conts = torch.tensor(list(itertools.product(range(vocab), repeat=steps)))
    with torch.no_grad():
        logp = torch.log_softmax(
            target(torch.cat([prompt.expand(len(conts), -1), conts], 1)).logits.double(), -1
        )
    total = sum(logp[torch.arange(len(conts)), len(prompt) - 1 + k, conts[:, k]] for k in range(steps))
    exact = {tuple(c.tolist()): float(p) for c, p in zip(conts, total.exp(), strict=True)}
    out = target.generate(
        prompt.expand(samples, -1), custom_generate=hsd_fast.generate, drafts=drafts, T=[2], compile=True,
        do_sample=True, top_k=None, max_new_tokens=steps, eos_token_id=None, seed=3, output_hsd_stats=True,
    )  # fmt: skip
    result = pooled_chi_square([tuple(r) for r in out.sequences[:, len(prompt) :].tolist()], exact)
    assert result.p_value > 1e-3, result
    assert 0 < out.hsd_stats.acceptance_rate(1) < 1


def test_the_host_time_of_a_run_is_what_its_steps_leave(models) -> None:
    target, drafts = models
    out = target.generate(
        torch.tensor([PROMPTS[1]]), custom_generate=hsd_fast.generate, drafts=drafts, T=[2], compile=True,
        do_sample=False, max_new_tokens=12, eos_token_id=None, output_hsd_stats=True,
    )  # fmt: skip
    stats = out.hsd_stats
    assert all(0 < inside <= wall for inside, wall in zip(stats.step_time, stats.wall_time, strict=True))
    assert stats.host_time == pytest.approx(sum(stats.wall_time) - sum(stats.step_time))
    assert 0 < stats.host_time < sum(stats.wall_time)


def test_short_memory_stops_compiling_and_keeps_the_tokens(monkeypatch) -> None:
    """On a CPU every graph holds a copy of its model's weights: with too little memory for another
    one, a compiled run builds no graph, says so once, and decodes the same tokens."""
    target = tiny_model("llama", layers=2, seed=11)
    drafts = derived_drafts(target, 1)
    monkeypatch.setattr(compile_policy, "available_memory", lambda: compile_policy.GRAPH_MEMORY_RESERVE - 1)
    torch._dynamo.utils.counters.clear()
    ids = torch.tensor([PROMPTS[1]])
    kwargs = {"do_sample": False, "max_new_tokens": 16, "eos_token_id": None}
    with pytest.warns(RuntimeWarning, match="compiles no more step graphs") as caught:
        out = target.generate(
            ids, custom_generate=hsd_fast.generate, drafts=drafts, T=[2], compile=True, **kwargs
        )
    assert out.tolist() == target.generate(ids, **kwargs).tolist()
    assert _compiles() == 0
    assert len([w for w in caught if "compiles no more" in str(w.message)]) == 2  # once per level


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_steps_replay_from_cuda_graphs() -> None:
    """On CUDA the compiled steps replay from CUDA graphs: none is skipped (a step that writes an
    input not marked static would be), greedy outputs equal HF's over requests whose new buffers
    make the graphs record again, and a sampled request repeated with its seed draws the same tokens
    (a replay over stale buffers would not)."""
    cpu_target = tiny_model("llama", layers=2)
    drafts = [d.cuda() for d in derived_drafts(cpu_target, 1)]
    target = cpu_target.cuda()
    counters = torch._dynamo.utils.counters
    counters.clear()
    for prompt, new in [(PROMPTS[0], 12), (PROMPTS[1], 20), (PROMPTS[0], 12), (PROMPTS[2], 9)]:
        ids = torch.tensor([prompt], device="cuda")
        kwargs = {"do_sample": False, "max_new_tokens": new, "eos_token_id": None}
        expected = target.generate(ids, **kwargs)
        out = target.generate(
            ids, custom_generate=hsd_fast.generate, drafts=drafts, T=[2], compile=True, **kwargs
        )
        assert out.tolist() == expected.tolist(), (prompt, new)
    sampled = [
        target.generate(
            torch.tensor([PROMPTS[1]], device="cuda"), custom_generate=hsd_fast.generate, drafts=drafts,
            T=[2], compile=True, do_sample=True, max_new_tokens=20, eos_token_id=None, seed=5,
        ).tolist()
        for _ in range(2)
    ]  # fmt: skip
    assert sampled[0] == sampled[1]
    assert counters["stats"]["unique_graphs"] > 0, "nothing was compiled"
    assert counters["inductor"]["cudagraph_skips"] == 0, "a compiled step ran without a CUDA graph"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_repeated_request_replays_without_recording(monkeypatch) -> None:
    """A request of shapes already seen takes the finished run's buffers (``buffer_pool.BufferPool``), so
    its steps replay the graphs recorded for those addresses: no CUDA graph is captured."""
    cpu_target = tiny_model("llama", layers=2)
    drafts = [d.cuda() for d in derived_drafts(cpu_target, 1)]
    target = cpu_target.cuda()
    captures = []
    capture_begin = torch.cuda.CUDAGraph.capture_begin

    def counting_capture_begin(graph, *args, **kwargs):
        captures.append(1)
        return capture_begin(graph, *args, **kwargs)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", counting_capture_begin)
    ids = torch.tensor([PROMPTS[1]], device="cuda")
    kwargs = {"do_sample": False, "max_new_tokens": 20, "eos_token_id": None}
    expected = target.generate(ids, **kwargs).tolist()
    recorded = []
    for _ in range(4):  # the first runs warm up and record; the last must only replay
        captures.clear()
        out = target.generate(
            ids, custom_generate=hsd_fast.generate, drafts=drafts, T=[2], compile=True, **kwargs
        )
        assert out.tolist() == expected
        recorded.append(len(captures))
    assert sum(recorded) > 0, "no CUDA graph was recorded at all"
    assert recorded[-1] == 0, f"CUDA graphs captured per request: {recorded}"


def test_every_graph_is_compiled_on_a_steps_first_call(models, monkeypatch) -> None:
    """Requests that differ in what a step's tensors hold but not in its key (EOS ids, the padding a
    history processor counts, max_new_tokens with output_scores) get graphs of their own on their
    steps' first calls, under the steps' compile settings (CPU: frozen weights), never one dynamo
    rebuilds inside an already compiled step (it would lack those settings, silently)."""
    target, drafts = models
    rebuilt = []
    real = compile_policy.Compiling.__call__

    def watched(self, *args):
        was, before = self.compiled, _compiles()
        out = real(self, *args)
        if was and _compiles() > before:
            rebuilt.append(self.name)
        return out

    monkeypatch.setattr(compile_policy.Compiling, "__call__", watched)
    processors = {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2, "bad_words_ids": [[7], [8, 9]]}
    requests = [
        ([[0, 0, 5, 9, 11], [3, 4, 5, 6, 7]], {"eos_token_id": None}, 8),
        ([[0, 5, 9, 11, 40], [3, 4, 5, 6, 7]], {"eos_token_id": 2}, 8),
        ([[0, 0, 0, 0, 5, 9], [3, 4, 5, 6, 7, 8]], {"eos_token_id": [2, 3]}, 8),
        ([[0, 0, 5, 9, 11], [3, 4, 5, 6, 7]], {"eos_token_id": 2, "output_scores": True}, 7),
    ]
    torch._dynamo.utils.counters.clear()
    for ids, options, new in requests:
        ids = torch.tensor(ids)
        kwargs = {
            "attention_mask": (ids != 0).long(), "do_sample": False, "max_new_tokens": new,
            "return_dict_in_generate": True, **processors, **options,
        }  # fmt: skip
        expected = target.generate(ids, **kwargs).sequences
        out = target.generate(
            ids, custom_generate=hsd_fast.generate, drafts=drafts, T=[2], compile=True, **kwargs
        )
        assert out.sequences.tolist() == expected.tolist(), options
    assert _compiles() > 0, "nothing was compiled"
    assert not rebuilt, f"dynamo rebuilt graphs inside compiled steps: {rebuilt}"
