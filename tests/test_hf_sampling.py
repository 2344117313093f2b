"""Sampled HSD on tiny HF models matches the target's exact distribution, and the known
residual-as-q bug fails the same test at the same sample count (significance 1e-3)."""

import pytest
import torch
from enumerated import exact_distribution, hsd_samples
from hf_models import peaked_family
from planted_bugs import residual_stored_as_q

import hsd_fast
from hsd_fast.testing.exactness import pooled_chi_square

pytestmark = pytest.mark.hf

V, STEPS, SAMPLES = 6, 3, 5000
PROMPT = torch.tensor([3, 4, 5, 1])


@pytest.fixture(scope="module")
def models() -> list[torch.nn.Module]:
    """Two drafts and a peaked target (scaled lm_head) over a vocabulary of 6."""
    return peaked_family(V)


@pytest.fixture(scope="module")
def exact(models) -> dict[tuple[int, ...], float]:
    """The target's distribution over all V**3 continuations, enumerated."""
    return exact_distribution(models[-1], PROMPT, V, STEPS)


def test_generate_samples_the_target_distribution(models, exact) -> None:
    *drafts, target = models
    torch.manual_seed(0)
    out = target.generate(
        PROMPT.expand(SAMPLES, -1),
        custom_generate=hsd_fast.generate,
        drafts=drafts,
        T=[2, 2],
        do_sample=True,
        max_new_tokens=STEPS,
        eos_token_id=None,
        output_hsd_stats=True,
    )
    samples = [tuple(row) for row in out.sequences[:, len(PROMPT) :].tolist()]
    result = pooled_chi_square(samples, exact)
    assert result.p_value > 1e-3, result
    assert all(0 < out.hsd_stats.acceptance_rate(lvl) < 1 for lvl in (1, 2))


@pytest.mark.slow
def test_residual_as_q_fails_the_same_test(models, exact) -> None:
    *drafts, target = models
    # eager: the planted bug indexes by a data-dependent mask, which torch.compile cannot trace, and
    # compile="auto" compiles after AUTO_COMPILE_AFTER_SECONDS of decoding, which a busy machine reaches
    with residual_stored_as_q():
        samples, _ = hsd_samples(target, drafts, PROMPT, SAMPLES, STEPS)
    assert pooled_chi_square(samples, exact).p_value < 1e-6
