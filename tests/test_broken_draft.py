"""A draft whose logits turn NaN or +inf (docs/design.md, "Why it is exact"): nothing drawn from them
is proposed and what a broken verifier emits goes up as point masses, so the output stays exactly
the target's (greedy: its own tokens; sampled: its distribution), with one warning per level and
run; broken logits at the target still raise."""

import copy
import warnings

import pytest
import torch
from hf_models import derived_drafts

import hsd_fast
from hsd_fast.engine import run_hsd
from hsd_fast.testing.exactness import pooled_chi_square
from hsd_fast.testing.tables import TableRunner, table_family

BROKEN = r"produced NaN or \+inf logits"


class BrokenRunner:
    """A runner whose logits turn to ``value`` at fed positions from ``after`` on and wherever the
    fed token is ``token`` (so breaking depends on what was drawn)."""

    def __init__(self, runner: TableRunner, value: float = float("nan"), after: int = 10**9, token: int = -1):
        self.runner, self.value, self.after, self.token = runner, value, after, token
        self.vocab_size, self.dtype = runner.vocab_size, runner.dtype

    def prepare(self, num_rows: int, capacity: int, tree_slots: int = 0) -> None:
        self.runner.prepare(num_rows, capacity, tree_slots)

    def forward(self, block, num_outputs: int) -> torch.Tensor:
        logits = self.runner.forward(block, num_outputs)
        first = block.positions.shape[1] - num_outputs  # the first output column
        fed = block.positions[:, first:], block.input_ids[:, first:]  # [B, O] each
        bad = (fed[0] >= self.after) | (fed[1] == self.token)  # [B, O]
        return torch.where(bad[..., None], self.value, logits)

    def move(self, tree_start, nodes, lengths) -> None:
        self.runner.move(tree_start, nodes, lengths)


def _warned(caught: list[warnings.WarningMessage]) -> list[str]:
    return [
        str(w.message) for w in caught if issubclass(w.category, RuntimeWarning) and "NaN" in str(w.message)
    ]


def _runners(family, broken_level: int, **breaking) -> list:
    runners = [TableRunner(m) for m in family]
    runners[broken_level] = BrokenRunner(runners[broken_level], **breaking)
    return runners


# ----------------------------------------------------------------------------- engine, table models
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "+inf"])
@pytest.mark.parametrize("broken_level", [0, 1])
@pytest.mark.parametrize("after", [0, 5], ids=["at once", "mid-run"])
def test_greedy_output_is_the_targets_with_one_warning(value, broken_level, after) -> None:
    family = table_family(5, 2, 3, spread=2.0, seed=4)
    prompts = [torch.tensor([0, 1]), torch.tensor([2, 3, 4])]
    kwargs = {"max_new_tokens": 12, "seeds": 1, "greedy": True}
    alone = run_hsd([TableRunner(family[-1])], prompts, block_sizes=[], **kwargs)
    runners = _runners(family, broken_level, value=value, after=after)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run_hsd(runners, prompts, block_sizes=[2, 2], **kwargs)
    assert [s.tolist() for s in out.sequences] == [s.tolist() for s in alone.sequences]
    (message,) = _warned(caught)
    assert f"draft level {broken_level}" in message


@pytest.mark.parametrize(
    ("broken_level", "breaking", "tree"),
    [
        (0, {"after": 3}, None),
        (1, {"after": 3}, None),
        (0, {"token": 1}, None),
        (1, {"token": 1}, None),
        (0, {"after": 3}, hsd_fast.Tree.full([2, 2])),
        (0, {"token": 1}, hsd_fast.Tree.full([2, 2])),
        (1, {"token": 1}, hsd_fast.Tree.full([2, 2])),
    ],
    ids=[
        "0 mid-run",
        "1 mid-run",
        "0 at a token",
        "1 at a token",
        "0 tree mid-run",
        "0 tree at a token",
        "1 over a tree",
    ],
)
def test_sampled_output_keeps_the_targets_distribution(broken_level, breaking, tree) -> None:
    """A draft level that breaks in mid-run, or whenever it is fed one token (so breaking depends on
    what was drawn): the rows still sample from the target's exact distribution."""
    steps, order = 4, 2
    family = table_family(4, order, 3, spread=2.0, seed=1)
    prompt = torch.arange(order)
    with pytest.warns(RuntimeWarning, match=BROKEN):
        result = run_hsd(
            _runners(family, broken_level, **breaking), [prompt] * 20_000, block_sizes=[2, 2],
            max_new_tokens=steps, seeds=0, tree=tree,
        )  # fmt: skip
    samples = [tuple(s[order:].tolist()) for s in result.sequences]
    exact = family[-1].continuation_probs(prompt.tolist(), steps)
    assert pooled_chi_square(samples, exact).p_value > 1e-3


def test_broken_logits_at_the_target_still_raise() -> None:
    runners = _runners(table_family(5, 2, 2, spread=2.0, seed=4), 1, after=5)
    with pytest.raises(FloatingPointError, match=r"level 1 produced NaN or \+inf logits .*the target"):
        run_hsd(runners, [torch.tensor([0, 1])], block_sizes=[2], max_new_tokens=12, seeds=1)


# ----------------------------------------------------------------------------- Hugging Face models
@pytest.fixture(scope="module")
def good(target) -> torch.nn.Module:
    return derived_drafts(target, 1)[0]


@pytest.fixture(scope="module")
def broken(target) -> torch.nn.Module:
    """A draft whose every logit is NaN (its output head's weights are)."""
    draft = copy.deepcopy(target)
    with torch.no_grad():
        draft.get_output_embeddings().weight.fill_(float("nan"))
    return draft


PROMPT = [[5, 9, 11, 40, 3, 7, 12, 60, 33]]


def _generate(target, drafts, **options):
    return target.generate(
        torch.tensor(PROMPT), custom_generate=hsd_fast.generate, drafts=drafts, max_new_tokens=20,
        compile=False, **options,
    )  # fmt: skip


@pytest.mark.hf
@pytest.mark.parametrize("where", ["alone", "below", "above", "tree"])
def test_a_nan_draft_model_leaves_the_targets_greedy_output(target, good, broken, where) -> None:
    drafts, options = {
        "alone": ([broken], {"T": [3]}),
        "below": ([broken, good], {"T": [2, 2]}),
        "above": ([good, broken], {"T": [2, 2]}),
        "tree": ([broken], {"tree": hsd_fast.Tree.spine(3, 2)}),
    }[where]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _generate(target, drafts, do_sample=False, **options)
    expected = target.generate(torch.tensor(PROMPT), do_sample=False, max_new_tokens=20)
    assert out.tolist() == expected.tolist()
    assert len(_warned(caught)) == 1


@pytest.mark.hf
@pytest.mark.parametrize("where", ["below", "above"])
def test_a_nan_draft_model_samples_repeatably_with_one_warning(target, good, broken, where) -> None:
    """Sampled (the distribution is tested on table models above): ids in the vocabulary, the same
    tokens for the same seed, one warning per call."""
    drafts = [broken, good] if where == "below" else [good, broken]
    outs = []
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outs.append(_generate(target, drafts, T=[2, 2], do_sample=True, seed=7))
        assert len(_warned(caught)) == 1
    assert outs[0].tolist() == outs[1].tolist()
    assert outs[0].shape == (1, len(PROMPT[0]) + 20)
    assert int(outs[0].min()) >= 0 and int(outs[0].max()) < target.config.vocab_size
