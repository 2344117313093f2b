"""What a benchmark runs on: a target, its candidate drafts (smallest first) and prompt sets.

- ``zoo``: the committed zoo (target ``s``, drafts ``xxs``, ``xs``, ``sm``) on held-out text: code
  (the Python calibration windows), prose (the Bible windows) and a repetitive set (a passage of
  the Python docs stated three times: a model continues it, and so agrees with its drafts).
- ``twin``: the same models with the costs of a larger family (``zoo.cost_twin``: the same logits,
  so the same tokens and acceptance, but the forward costs of the named shapes): the target costs
  about 100x ``xxs``, a middle draft 5-20x, as in real families where a hierarchy pays.
- ``exits``: a zoo target trained for early exits, with ``xxs``, ``xs`` and the target's own first
  layers as drafts (``hsd_fast.EarlyExit``), and HF's ``assistant_early_exit`` beside them.
- ``tokenizers``: the cost twin's target with ``xs`` and ``xs4k`` (``xs``'s shape on the zoo's
  4,096-entry tokenizer) drafting through the byte bridge (``hsd_fast.OtherTokenizerDraft``), and HF's
  own ``assistant_tokenizer=`` path for that pair beside it.
- ``tiny``: a random tiny family built from a config, for smoke tests (no zoo needed).
- ``checkpoints``: the user's own target and drafts (``hsd-fast bench --target DIR --drafts DIR ...``:
  checkpoint directories, zoo names, ``exitK``), on the machine's varied text (``text_sets``).

Any scenario with a tokenizer can be measured on other text instead of its own sets (``on_text``:
``--text`` sets of the machine, ``--prompts`` files of the user's).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from hsd_fast.other_tokenizer import OtherTokenizerDraft

PROMPT_TOKENS = 64


@dataclass
class Scenario:
    name: str
    description: str  # the models and their shapes, for the report
    target: torch.nn.Module
    drafts: dict[str, torch.nn.Module | OtherTokenizerDraft]  # smallest first
    prompt_sets: dict[str, list[torch.Tensor]]  # name -> prompts (1-D token ids)
    calibration: torch.Tensor  # [N, L] token ids for acceptance profiles (teacher-forced)
    exits: dict[str, int] = field(default_factory=dict)  # draft name -> k, for the early-exit levels
    tokenizer: object | None = None  # the target's, to put other text in its ids (``on_text``)


def zoo_scenario(dtype: torch.dtype = torch.float32) -> Scenario:
    from hsd_fast import zoo
    from hsd_fast.zoo.calibration import read_calibration

    names = zoo.names()
    models = {name: zoo.load(name, dtype) for name in names}
    windows = read_calibration(zoo.zoo_dir())  # source -> [8, 128] held-out token windows
    return Scenario(
        name="zoo",
        description=", ".join(f"{n} ({m.num_parameters() / 1e6:.1f} M)" for n, m in models.items())
        + f"; target {names[-1]}",
        target=models[names[-1]],
        drafts={n: models[n] for n in names[:-1]},
        prompt_sets=_zoo_prompts(windows),
        calibration=torch.cat(list(windows.values())),
        tokenizer=zoo.load_tokenizer(),
    )


def _zoo_prompts(windows: dict[str, torch.Tensor]) -> dict[str, list[torch.Tensor]]:
    passage = PROMPT_TOKENS // 3
    return {
        "code": list(windows["python-code"][:, :PROMPT_TOKENS]),
        "prose": list(windows["bible"][:, :PROMPT_TOKENS]),
        "repetitive": [w[:passage].repeat(3) for w in windows["python-docs"]],
    }


EXITS = (1, 2, 3)  # the early-exit levels of the `exits` scenario (its target has 6 layers)


def exits_scenario() -> Scenario:
    """The zoo's drafts and early exits of a target trained for them (``sx``, trained from scratch
    with the exit loss, else ``se``, where the zoo has them; ``s`` otherwise): ``xxs``, ``xs``, then
    ``exit1``.. (``hsd_fast.EarlyExit(target, k)``), which cost more than ``xs`` and less than the
    target (docs/design.md, "Early-exit levels")."""
    from hsd_fast import zoo
    from hsd_fast.early_exit import EarlyExit

    scenario = zoo_scenario()
    name = next((n for n in ("sx", "se") if n in zoo.names(variants=True)), "s")
    target = zoo.load(name) if name != "s" else scenario.target
    scenario.name = "exits"
    scenario.target = target
    scenario.drafts = {n: scenario.drafts[n] for n in ("xxs", "xs")}
    scenario.exits = {f"exit{k}": k for k in EXITS}
    scenario.drafts |= {n: EarlyExit(target, k) for n, k in scenario.exits.items()}
    scenario.description = (
        f"target {name} ({target.num_parameters() / 1e6:.1f} M, 6 layers); drafts xxs, xs and its early "
        f"exits after layers {', '.join(map(str, EXITS))}"
    )
    return scenario


TWIN_SHAPES = {  # name -> (hidden, layers, MLP width): the cost of larger models, the zoo's function
    "s": (768, 12, 2048),  # the target: ~100x the cost of a compiled xxs step on the 2-core CPU
    "sm": (384, 8, 1024),  # a middle draft: ~5-20x xxs
}


def twin_scenario() -> Scenario:
    from hsd_fast.zoo import cost_twin

    scenario = zoo_scenario()
    twins = {}
    for name, (hidden, layers, mlp) in TWIN_SHAPES.items():
        model = scenario.target if name == "s" else scenario.drafts[name]
        twins[name] = cost_twin(model, hidden_size=hidden, num_layers=layers, intermediate_size=mlp)
    shapes = "; ".join(
        f"{n} as hidden {h}, {layer} layers, MLP {m}" for n, (h, layer, m) in TWIN_SHAPES.items()
    )
    scenario.name = "twin"
    scenario.description = f"the zoo with cost twins ({shapes}): same logits, larger costs"
    scenario.target = twins["s"]
    scenario.drafts = {n: twins.get(n, d) for n, d in scenario.drafts.items()}
    return scenario


CHAIN_T = 3
"""The block size of ``xxs4k`` under ``xs4k`` in the tokenizers scenario."""


def tokenizers_scenario() -> Scenario:
    """The cost twin's target with two drafts of one shape: ``xs`` on the target's tokenizer and
    ``xs4k`` on a tokenizer of its own, bridged (docs/design.md, "Drafts with another tokenizer"),
    alone and with ``xxs4k`` drafting for it in their tokenizer (a hierarchy inside the bridged level,
    block size ``CHAIN_T``)."""
    from hsd_fast import zoo

    scenario = twin_scenario()
    tok4k, tok = zoo.load_tokenizer("xs4k"), zoo.load_tokenizer()
    xs4k = zoo.load("xs4k")
    chained = OtherTokenizerDraft(xs4k, tok4k, tok, below=(zoo.load("xxs4k"),), block_sizes=(CHAIN_T,))
    scenario.name = "tokenizers"
    scenario.drafts = {
        "xs4k": OtherTokenizerDraft(xs4k, tok4k, tok), "xs4k+xxs4k": chained, "xs": scenario.drafts["xs"]
    }  # fmt: skip
    scenario.description = (
        f"{scenario.description}; drafts xs, xs4k (xs's shape on a 4,096-entry tokenizer of its own, "
        f"through the byte bridge) and xs4k+xxs4k (xxs4k drafting {CHAIN_T} ids per xs4k verification in "
        "their tokenizer, xs4k bridged)"
    )
    return scenario


def checkpoints_scenario(target: str, drafts: list[str]) -> Scenario:
    """The user's own models, named as ``hsd-fast select`` names them (``select_levels``): a target
    and drafts smallest first, each a checkpoint directory, a zoo model or ``exitK`` (the target's
    first K layers); a draft whose tokenizer has another vocabulary than the target's drafts through
    the byte bridge. In float32 on the CPU. No prompt sets yet: ``on_text`` gives them."""
    from hsd_fast.early_exit import EarlyExit
    from hsd_fast.lookup import LOOKUP
    from hsd_fast.other_tokenizer import same_tokenizer
    from hsd_fast.select_levels import exit_depth, load_model, text_tokenizer_of, tokenizer_of

    levels = [name for name in drafts if name != LOOKUP]  # the lookup level is every bench's candidate 0
    models = {name: load_model(name, torch.float32) for name in [*levels, target] if exit_depth(name) is None}
    own = text_tokenizer_of(target, models[target], tokenizer_of(target))
    chosen: dict[str, torch.nn.Module | OtherTokenizerDraft] = {}
    exits = {}
    for name in levels:
        if exit_depth(name) is not None:
            exits[name] = exit_depth(name)
            chosen[name] = EarlyExit(models[target], exits[name])
            continue
        tokenizer = tokenizer_of(name)
        bridged = tokenizer is not None and not same_tokenizer(tokenizer, own)
        chosen[name] = OtherTokenizerDraft(models[name], tokenizer, own) if bridged else models[name]

    def size(name: str) -> str:
        return f"{name} ({models[name].num_parameters() / 1e6:.1f} M)" if name in models else name

    return Scenario(
        name="checkpoints",
        description=f"target {size(target)}; drafts {', '.join(map(size, levels)) or 'none'}",
        target=models[target],
        drafts=chosen,
        prompt_sets={},
        calibration=torch.empty(0, 0, dtype=torch.long),
        exits=exits,
        tokenizer=own,
    )


CALIBRATION_PER_SET = 4
"""Calibration windows (of ``CALIBRATION_TOKENS``) cut from each text set for the selector's profile."""
CALIBRATION_TOKENS = 128


def on_text(scenario: Scenario, sets: list, prompts_per_set: int) -> Scenario:
    """``scenario`` measured on ``sets`` (``text_sets`` names or ``TextSet``s) instead of its own
    prompt sets: each set's text in the target's tokenizer, cut into ``prompts_per_set`` prompts of
    ``PROMPT_TOKENS`` and ``CALIBRATION_PER_SET`` calibration windows, never overlapping; the
    calibration is every set's windows. A ValueError names a set the machine lacks, a file too short,
    or a scenario without a tokenizer."""
    from hsd_fast.bench.text_sets import prompt_set

    if scenario.tokenizer is None:
        raise ValueError(f"the {scenario.name} scenario has no tokenizer to put text in its ids")
    tokenizer = scenario.tokenizer

    def encode(text: str) -> list[int]:
        return tokenizer(text)["input_ids"]

    found = [
        prompt_set(s, encode, CALIBRATION_PER_SET, prompts_per_set, CALIBRATION_TOKENS, PROMPT_TOKENS)
        for s in sets
    ]
    scenario.prompt_sets = {f.name: list(f.prompts) for f in found}
    scenario.calibration = torch.cat([f.calibration for f in found])
    scenario.description += f"; text: {', '.join(f'{f.name} ({f.kind})' for f in found)}"
    return scenario


def draft_models(scenario: Scenario) -> list[torch.nn.Module]:
    """Every draft's models (a bridged draft's included, with those under it), in order."""
    return [
        m
        for d in scenario.drafts.values()
        for m in (d.models if isinstance(d, OtherTokenizerDraft) else (d,))
    ]


def tiny_scenario(seed: int = 0) -> Scenario:
    """A random 4-layer Llama target and drafts made of its first 1 and 2 layers (so they agree with
    it often): a family that builds in a second, for smoke tests."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, attn_implementation="sdpa", eos_token_id=None,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        target = LlamaForCausalLM(config)
    target = target.to_empty(device="cpu")
    with torch.no_grad():
        for name, param in target.named_parameters():
            scale = 1.0 if name.endswith("norm.weight") else 0.5 if "lm_head" in name else 0.1
            param.copy_(
                torch.ones_like(param)
                if name.endswith("norm.weight")
                else torch.randn(param.shape, generator=generator) * scale
            )
    target.model.rotary_emb = type(target.model.rotary_emb)(config=config)
    target.eval()
    drafts = {f"first{k}": _first_layers(target, k) for k in (1, 2)}
    prompts = torch.randint(0, 128, (8, 16), generator=generator)
    return Scenario(
        name="tiny",
        description="random Llama, hidden 64, 4 layers, vocabulary 128; drafts: its first 1 and 2 layers",
        target=target,
        drafts=drafts,
        prompt_sets={"random": list(prompts)},
        calibration=torch.randint(0, 128, (4, 32), generator=generator),
    )


def _first_layers(model: torch.nn.Module, keep: int) -> torch.nn.Module:
    draft = copy.deepcopy(model)
    draft.model.layers = draft.model.layers[:keep]
    draft.config.num_hidden_layers = keep
    return draft


SCENARIOS = {
    "zoo": zoo_scenario,
    "twin": twin_scenario,
    "tiny": tiny_scenario,
    "exits": exits_scenario,
    "tokenizers": tokenizers_scenario,
}
