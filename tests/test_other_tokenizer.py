"""Drafts with another tokenizer (hsd_fast/other_tokenizer.py, hsd_fast/bridge.py): the byte bridge
spells ids as bytes and back; greedy output equals the target's own on both API paths (a random
draft that rarely agrees, and zoo ``xs`` behind a permuted vocabulary, which must agree as often as
``xs`` itself does); sampled output matches the target's exact distribution on a 4-token vocabulary,
and verifying the bridged proposals as if a model had drafted them fails the same test; bad
arguments are refused with errors that name them."""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch
from enumerated import exact_distribution
from hf_models import noisy_copy, tiny_model
from planted_bugs import proposal_q_one_slot_late, proposals_verified_as_drafts
from test_profile import FakeClock

import hsd_fast
from hsd_fast import zoo
from hsd_fast.attached import attached
from hsd_fast.bridge import TokenBytes, complete_prefix, shared_ids
from hsd_fast.hf_runner import HFRunner
from hsd_fast.latency import BridgedCost
from hsd_fast.processors import LogitsTransform
from hsd_fast.profile import ProfileCache, ProfileNoiseWarning
from hsd_fast.proposal_scores import replay
from hsd_fast.sampling_metadata import SamplingMetadata
from hsd_fast.testing.exactness import pooled_chi_square

pytestmark = pytest.mark.hf


def byte_level_tokenizer(pieces: list[str], merges: list[tuple[str, str]] = (), eos: str | None = None):
    """A byte-level BPE tokenizer over ``pieces`` (ids in order), as HF's fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=list(merges)))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=eos)


def printable() -> list[str]:
    """The 96 bytes 32..127 in the byte-level alphabet (space is written 'Ġ')."""
    tok = byte_level_tokenizer(["a"])  # any: only its pre-tokenizer's alphabet is read
    return [tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str(chr(b))[0][0] for b in range(32, 128)]


@pytest.fixture(scope="module")
def tokenizers():
    """A target tokenizer of single characters (96 ids) and a draft one that also merges pairs."""
    chars = printable()
    pairs = [("Ġ", "t"), ("h", "e"), ("e", "r"), ("i", "n"), ("Ġ", "a"), ("o", "n"), ("r", "e"), ("a", "t")]
    return byte_level_tokenizer(chars), byte_level_tokenizer(chars + [a + b for a, b in pairs], pairs)


def test_token_bytes_spell_the_text_back() -> None:
    tok = zoo.load_tokenizer()
    table = TokenBytes.of(tok)
    text = "def f(x):\n    return x * 2  # héllo ✓\n"
    ids = tok(text, add_special_tokens=False).input_ids
    assert table.bytes_of(ids) == text.encode()
    assert table.encode(text.encode()) == ids
    assert table.bytes_of([tok.eos_token_id]) == b""  # a special token has no text
    assert table.encode("é".encode()[:1]) is None  # not text: nothing the bridge could place


def test_complete_prefix_stops_at_an_unfinished_or_broken_character() -> None:
    check = "a✓".encode()  # 1 + 3 bytes
    assert [complete_prefix(check[:n]) for n in range(5)] == [0, 1, 1, 1, 4]
    assert complete_prefix(b"ab\xffcd") == 2


def selection_inputs(tok, clock) -> dict:
    """``select_hierarchy``'s calibration prompts (three short sentences, [3, 24] ids of ``tok``) and
    settings for the tests that select over a draft with another tokenizer on a fake ``clock``."""
    texts = ["the cat sat on the mat and", "in there we went to the end", "at the end of the line we"]
    prompts = torch.tensor([tok(t).input_ids[:24] for t in texts])  # [3, 24]
    return {"prompts": prompts, "clock": clock, "progress": False, "max_T": 4, "min_gain": 0.0}


def padded_batch(tok, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``texts`` as a left-padded batch (id 0) and its attention mask, both [B, L]."""
    rows = [tok(t).input_ids for t in texts]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def _greedy(model, ids, **kwargs):
    kwargs.setdefault("attention_mask", torch.ones_like(ids))  # id 0 is a character here, not padding
    return model.generate(ids, do_sample=False, max_new_tokens=24, eos_token_id=None, **kwargs)


def test_greedy_equals_the_target_with_a_random_draft_on_both_paths(tokenizers) -> None:
    target_tok, draft_tok = tokenizers
    target = tiny_model("llama", vocab_size=len(target_tok), lm_head_scale=2.0)
    draft = tiny_model("llama", vocab_size=len(draft_tok), layers=2, seed=3)
    ids = torch.tensor([target_tok("the cat sat on the mat").input_ids])
    expected = _greedy(target, ids)
    out = _greedy(
        target, ids, custom_generate=hsd_fast.generate, drafts=[draft], T=[4], target_tokenizer=target_tok,
        draft_tokenizers=[draft_tok], output_hsd_stats=True,
    )  # fmt: skip
    assert out.sequences.tolist() == expected.tolist()
    assert out.hsd_stats.drafted[0] > 0, out.hsd_stats.summary()  # the bridge proposed
    wrapped = hsd_fast.wrap(target, [draft], T=[4], tokenizer=target_tok, draft_tokenizers=[draft_tok])
    assert isinstance(wrapped.drafts[0], hsd_fast.OtherTokenizerDraft)
    assert _greedy(wrapped, ids).tolist() == expected.tolist()


def test_greedy_in_a_padded_batch_with_an_eos_under_a_second_draft(tokenizers) -> None:
    target_tok, draft_tok = tokenizers
    target = tiny_model("llama", vocab_size=len(target_tok), lm_head_scale=2.0)
    middle = tiny_model("llama", vocab_size=len(target_tok), layers=2, seed=5)
    draft = tiny_model("llama", vocab_size=len(draft_tok), layers=2, seed=3)
    texts = ["the cat sat on the mat", "in there", "at the end of the line we stop"]
    ids, mask = padded_batch(target_tok, texts)
    width = ids.shape[1]
    free = _greedy(target, ids, attention_mask=mask)
    eos = int(free[1, width + 5])  # row 1 stops there (or earlier)
    kwargs = {"attention_mask": mask, "eos_token_id": eos, "pad_token_id": 0}
    expected = target.generate(ids, do_sample=False, max_new_tokens=24, **kwargs)
    out = target.generate(
        ids, do_sample=False, max_new_tokens=24, custom_generate=hsd_fast.generate, drafts=[draft, middle],
        T=[3, 2], target_tokenizer=target_tok, draft_tokenizers=[draft_tok, None], **kwargs,
    )  # fmt: skip
    assert out.tolist() == expected.tolist()


@pytest.mark.slow
def test_compiled_draft_steps_in_a_padded_batch_equal_the_targets_greedy(tokenizers) -> None:
    """The draft's steps compiled (a graph per block width and draft count, counts rounded up to a
    bucket, a row whose draft ends its text cut on the host), three rows of different lengths."""
    target_tok, draft_tok = tokenizers
    target = tiny_model("llama", vocab_size=len(target_tok), lm_head_scale=2.0)
    draft = tiny_model("llama", vocab_size=len(draft_tok), layers=2, seed=3)
    draft.generation_config.eos_token_id = len(draft_tok) - 1  # a merged pair ends the draft's text
    ids, mask = padded_batch(target_tok, ["the cat sat on the mat", "in there", "at the end"])
    expected = _greedy(target, ids, attention_mask=mask)
    out = _greedy(
        target, ids, attention_mask=mask, custom_generate=hsd_fast.generate, drafts=[draft], T=[3],
        target_tokenizer=target_tok, draft_tokenizers=[draft_tok], compile=True, output_hsd_stats=True,
    )  # fmt: skip
    assert out.sequences.tolist() == expected.tolist()
    assert out.hsd_stats.drafted[0] > 0, out.hsd_stats.summary()
    assert _compiled_draft_steps(draft, len(draft_tok))  # the draft's steps ran compiled


@pytest.mark.slow
def test_compiled_shared_sampling_draws_what_the_eager_steps_draw(four_letters) -> None:
    """The draft's sampled steps (ids drawn from the shared vocabulary, their q handed up) compiled:
    the same tokens as eagerly, keyed randomness drawing the same ids, three rows."""
    target, draft, _, target_tok, draft_tok = four_letters
    ids = torch.tensor(target_tok("abcda").input_ids).expand(3, -1)
    kwargs = {"custom_generate": hsd_fast.generate, "T": [3], "max_new_tokens": 40, "eos_token_id": None}
    kwargs |= {"do_sample": True, "top_k": None, "seed": 0, "attention_mask": torch.ones_like(ids)}
    drafts = [hsd_fast.OtherTokenizerDraft(draft, draft_tok, target_tok)]
    eager = target.generate(ids, drafts=drafts, compile=False, **kwargs)
    compiled = target.generate(ids, drafts=drafts, compile=True, output_hsd_stats=True, **kwargs)
    assert compiled.sequences.tolist() == eager.tolist()
    assert compiled.hsd_stats.accepted[1] > 0, compiled.hsd_stats.summary()
    sampled = [key for key in _compiled_draft_steps(draft, len(draft_tok)) if key[-1]]
    assert sampled  # the draft's sampled steps ran compiled


def _compiled_draft_steps(draft: torch.nn.Module, vocab_size: int) -> list[tuple]:
    """The keys of the compiled steps kept for ``draft`` as a draft with another tokenizer."""
    return list(attached(HFRunner.of(draft, vocab_size), "draft steps").get("graphs", {}))


def _permuted(tok, model):
    """``tok`` with every id but 0 renumbered (i -> V - i), and ``model`` with its embedding and
    head rows moved to match: the same draft, behind another vocabulary."""
    spec = json.loads(tok.backend_tokenizer.to_str())
    size = len(tok)
    spec["model"]["vocab"] = {piece: (size - i) % size for piece, i in spec["model"]["vocab"].items()}
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    permuted_tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)))
    order = torch.tensor([(size - i) % size for i in range(size)])  # an involution: its own inverse
    permuted = copy.deepcopy(model)
    with torch.no_grad():
        permuted.get_input_embeddings().weight.copy_(model.get_input_embeddings().weight[order])
        permuted.get_output_embeddings().weight.copy_(model.get_output_embeddings().weight[order])
    return permuted_tok, permuted


def test_a_draft_behind_a_permuted_vocabulary_agrees_as_often_as_itself() -> None:
    """Zoo ``xs`` under ``s``, directly and through the bridge with its vocabulary renumbered: the
    bridge must hand ``s`` the same text, so about as many proposals are accepted (the bridge holds
    back the last target token of each draft, which may still grow)."""
    tok, target, xs = zoo.load_tokenizer(), zoo.load("s"), zoo.load("xs")
    permuted_tok, permuted = _permuted(tok, xs)
    ids = tok("def parse(line):\n    fields = line.split(',')\n", return_tensors="pt").input_ids
    expected = _greedy(target, ids)
    direct = _greedy(
        target, ids, custom_generate=hsd_fast.generate, drafts=[xs], T=[4], output_hsd_stats=True
    )
    bridged = _greedy(
        target, ids, custom_generate=hsd_fast.generate, drafts=[permuted], T=[4], target_tokenizer=tok,
        draft_tokenizers=[permuted_tok], output_hsd_stats=True,
    )  # fmt: skip
    assert bridged.sequences.tolist() == expected.tolist() == direct.sequences.tolist()
    assert bridged.hsd_stats.accepted[1] >= 0.7 * direct.hsd_stats.accepted[1] > 0, (
        bridged.hsd_stats.summary(),
        direct.hsd_stats.summary(),
    )


# ------------------------------------------------------------------------------ sampled, exact
VOCAB, STEPS = 4, 3


def _sampled(
    target, draft, middle, target_tok, draft_tok, samples: int, shared: bool | None = None, **sampling
):
    """``samples`` sampled continuations through the bridge (``shared``: the draft's sampling mode,
    None: what ``draft_tokenizers=`` gives; ``sampling``: temperature, top_k), the exact distribution
    and the run's stats."""
    sampling = {"temperature": 1.0, "top_k": None} | sampling
    prompt = torch.tensor(target_tok("abcda").input_ids)
    ids = prompt.expand(samples, -1)
    if isinstance(draft, hsd_fast.OtherTokenizerDraft):  # a level made by the caller
        tokenizers = {}
    elif shared is None:
        tokenizers = {"target_tokenizer": target_tok, "draft_tokenizers": [draft_tok, None]}
    else:
        draft, tokenizers = hsd_fast.OtherTokenizerDraft(draft, draft_tok, target_tok, shared), {}
    out = target.generate(
        ids, attention_mask=torch.ones_like(ids), custom_generate=hsd_fast.generate, drafts=[draft, middle],
        T=[2, 2], do_sample=True, max_new_tokens=STEPS, eos_token_id=None, seed=0, compile=False,
        output_hsd_stats=True, **tokenizers, **sampling,
    )  # fmt: skip
    samples = [tuple(row) for row in out.sequences[:, len(prompt) :].tolist()]
    return samples, exact_distribution(target, prompt, VOCAB, STEPS, **sampling), out.hsd_stats


@pytest.fixture(scope="module")
def four_letters():
    """A 4-token target (a-d), a middle level on its tokens, and a draft with merges and an EOS
    (``<e>``, id 0)."""
    target_tok = byte_level_tokenizer(list("abcd"))
    draft_tok = byte_level_tokenizer(
        ["<e>", *"abcd", "ab", "ca", "dd"], [("a", "b"), ("c", "a"), ("d", "d")], "<e>"
    )
    target = tiny_model("llama", vocab_size=VOCAB, layers=2, lm_head_scale=3.0, seed=2)
    middle = tiny_model("llama", vocab_size=VOCAB, layers=2, lm_head_scale=3.0, seed=7)
    draft = tiny_model("llama", vocab_size=len(draft_tok), layers=1, lm_head_scale=3.0, seed=4)
    draft.generation_config.eos_token_id = 0
    return target, draft, middle, target_tok, draft_tok


@pytest.mark.parametrize(
    "shared, sampling",
    [(False, {}), (None, {}), (None, {"temperature": 0.6, "top_k": 3})],
    ids=["point masses", "shared vocabulary (the default)", "shared, a temperature among processors"],
)
def test_sampling_through_the_bridge_is_exact(four_letters, shared, sampling) -> None:
    target, draft, middle, target_tok, draft_tok = four_letters
    samples, exact, stats = _sampled(target, draft, middle, target_tok, draft_tok, 4000, shared, **sampling)
    assert pooled_chi_square(samples, exact).p_value > 1e-3
    assert stats.drafted[0] > 0 and stats.accepted[1] > 0 and stats.corrections[1] > 0, stats.summary()


def test_the_draft_samples_from_the_shared_vocabulary_by_default(four_letters) -> None:
    """4 of the draft's 7 ids that spell text are one target id each: a sampled run draws from
    them and hands their q up; a greedy run, or one told not to, proposes point masses."""
    _, draft, _, target_tok, draft_tok = four_letters
    assert hsd_fast.OtherTokenizerDraft(draft, draft_tok, target_tok).draws_q(greedy=False)
    assert not hsd_fast.OtherTokenizerDraft(draft, draft_tok, target_tok).draws_q(greedy=True)
    assert not hsd_fast.OtherTokenizerDraft(draft, draft_tok, target_tok, False).draws_q(greedy=False)
    sources, targets = shared_ids(TokenBytes.of(draft_tok), TokenBytes.of(target_tok))
    assert (draft_tok.convert_ids_to_tokens(sources), targets) == (list("abcd"), [0, 1, 2, 3])


def test_the_draft_draws_at_a_temperature_among_the_processors(four_letters) -> None:
    """With top-k beside the temperature the logits reach the ops processed (the ops' temperature
    is 1): the draft scales its own logits by the processors' temperature, as a model draft's are."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper

    _, draft, _, target_tok, draft_tok = four_letters
    spec = hsd_fast.OtherTokenizerDraft(draft, draft_tok, target_tok)
    sampling = SamplingMetadata.build(1, torch.device("cpu"))
    plain = spec.proposer(1, sampling, transform=LogitsTransform([TemperatureLogitsWarper(0.5)]))
    both = spec.proposer(
        1, sampling, transform=LogitsTransform([TopKLogitsWarper(3), TemperatureLogitsWarper(0.5)])
    )
    assert plain.shared.scale.item() == 1.0  # the ops divide by the temperature themselves
    assert both.shared.scale.item() == 2.0


def test_the_replay_of_a_sampling_draft_keeps_each_tokens_q(four_letters) -> None:
    """The selector's replay (``proposal_scores.replay``) of a sampled run draws as the run does and
    keeps each proposed token's q, at which the profile prices it (min(1, p / q)); greedy, none."""
    _, draft, _, target_tok, draft_tok = four_letters
    spec = hsd_fast.OtherTokenizerDraft(draft, draft_tok, target_tok)
    ids = torch.randint(0, VOCAB, (3, 24), generator=torch.Generator().manual_seed(0))
    calls = replay(spec, ids, 3, start=4, transform=LogitsTransform())
    drawn = [q for call in calls for q in call.q]
    assert drawn and all(0 < q <= 1 for q in drawn) and min(drawn) < 1
    assert all(call.q is None for call in replay(spec, ids, 3, start=4))


@pytest.mark.parametrize(
    "shared, bug",
    [(False, proposals_verified_as_drafts), (True, proposal_q_one_slot_late)],
    ids=["point masses verified as drafts", "shared q one slot late"],
)
def test_a_planted_bug_fails_the_same_test(four_letters, shared, bug) -> None:
    target, draft, middle, target_tok, draft_tok = four_letters
    with bug():
        samples, exact, _ = _sampled(target, draft, middle, target_tok, draft_tok, 4000, shared)
    assert pooled_chi_square(samples, exact).p_value < 1e-6


# ------------------------------------------------------------------------------ refusals
def test_bad_tokenizer_arguments_are_refused(tokenizers) -> None:
    target_tok, draft_tok = tokenizers
    target = tiny_model("llama", vocab_size=len(target_tok))
    draft = tiny_model("llama", vocab_size=len(draft_tok), layers=2)
    ids = torch.tensor([target_tok("the cat").input_ids])
    call = {"custom_generate": hsd_fast.generate, "max_new_tokens": 4, "do_sample": False}
    with pytest.raises(ValueError, match="target_tokenizer="):
        target.generate(ids, drafts=[draft], draft_tokenizers=[draft_tok], **call)
    with pytest.raises(ValueError, match="one entry per draft"):
        target.generate(
            ids, drafts=[draft], draft_tokenizers=[draft_tok, None], target_tokenizer=target_tok, **call
        )
    with pytest.raises(ValueError, match="adapt"):
        hsd_fast.wrap(target, [draft], adapt=True, tokenizer=target_tok, draft_tokenizers=[draft_tok])
    # the same vocabulary is no boundary: the draft stays a plain model level
    same = hsd_fast.wrap(target, [target], tokenizer=target_tok, draft_tokenizers=[copy.deepcopy(target_tok)])
    assert same.drafts == [target]


# ------------------------------------------------------------------------------ selection
def test_select_hierarchy_profiles_a_draft_with_another_tokenizer(tokenizers, tmp_path) -> None:
    """A draft behind a renumbered vocabulary (the same model as a same-tokenizer candidate), on a
    fake clock: its replayed proposals are the draft's own argmax, so the rate the target accepts
    the first of them with is the same-tokenizer draft's agreement with the target (the contexts
    differ a little: the replay visits the positions a run would); its calls cost more for larger
    blocks; the pick drafts through the bridge and generates the target's own greedy output."""
    target_tok, _ = tokenizers
    target = tiny_model("llama", vocab_size=len(target_tok), lm_head_scale=2.0)
    draft = noisy_copy(target, 0.1, seed=1)
    permuted_tok, permuted = _permuted(target_tok, draft)
    clock = FakeClock()
    for model, scale in ((draft, 1), (permuted, 1), (target, 40)):
        clock.attach(model, scale=scale)
    common = selection_inputs(target_tok, clock)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileNoiseWarning)
        direct = hsd_fast.select_hierarchy(target, [draft], cache=ProfileCache(), **common)
        pick = hsd_fast.select_hierarchy(
            target, [permuted], draft_tokenizers=[permuted_tok], target_tokenizer=target_tok,
            cache=ProfileCache(tmp_path / "profiles.json"), **common,
        )  # fmt: skip
    assert isinstance(pick.drafts[0], hsd_fast.OtherTokenizerDraft) and pick.chain == (0, 1), pick.chain
    cost, rates = pick.profile.costs[0], pick.profile.alpha[0][1]
    assert isinstance(cost, BridgedCost) and cost.draft(4) > cost.draft(1) > 0, cost
    assert abs(rates[0] - direct.profile.alpha[0][1]) < 0.15, (rates, direct.profile.alpha[0][1])
    entries = json.loads((tmp_path / "profiles.json").read_text())["entries"]
    assert sum(k.startswith("bridged rates ") for k in entries) == 1  # the target, the only model
    assert sum(k.startswith("bridged cost ") for k in entries) == 4  # a call per block size

    ids = common["prompts"][:1, :12]
    expected = _greedy(target, ids)
    assert (
        _greedy(target, ids, custom_generate=hsd_fast.generate, hierarchy=pick).tolist() == expected.tolist()
    )


def test_select_hierarchy_refuses_bad_draft_tokenizers(tokenizers) -> None:
    target_tok, draft_tok = tokenizers
    target = tiny_model("llama", vocab_size=len(target_tok), lm_head_scale=2.0)
    ids = torch.ones(1, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="one entry per candidate"):
        hsd_fast.select_hierarchy(target, [target], ids, draft_tokenizers=[], target_tokenizer=target_tok)
    with pytest.raises(ValueError, match="needs target_tokenizer"):
        hsd_fast.select_hierarchy(target, [target], ids, draft_tokenizers=[draft_tok])
    with pytest.raises(TypeError, match="not a model"):
        hsd_fast.select_hierarchy(
            target, ["lookup"], ids, draft_tokenizers=[draft_tok], target_tokenizer=target_tok
        )
