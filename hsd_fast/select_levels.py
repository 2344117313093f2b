"""The levels ``hsd-fast select`` offers, by name, and the names of the levels it picked.

A name is a zoo model (the family or a variant such as ``sx``), a checkpoint directory, ``lookup``
(the model-free lookup level) or ``exitK``: the target's own first ``K`` layers with its final norm and
head (``hsd_fast.EarlyExit(target, K)``; write ``./exit2`` for a directory called ``exit2``). By
default the target is the zoo's largest family model and the candidates are the lookup level and the
zoo's family models smaller than the target, plus exits 1..L/2 for a target of L layers trained for
early exits (the zoo's ``se`` and ``sx``): a deeper exit costs most of the target's own step. A model
whose tokenizer is not the target's (the zoo's ``xs4k``, or a checkpoint directory with a tokenizer of
another vocabulary) is a draft with another tokenizer (``hsd_fast.OtherTokenizerDraft``): one per run.

The checks here read config files and the zoo's manifest only: a name that cannot work is a usage
error before any model is loaded.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from hsd_fast.early_exit import exit_of, reuses_hidden
from hsd_fast.lookup import LOOKUP, LookupDraft
from hsd_fast.other_tokenizer import OtherTokenizerDraft
from hsd_fast.positions import read_config

_EXIT_NAME = re.compile(r"exit([0-9]+)")
RECOMPUTED = " (recompute)"
"""Marks an exit's recomputing twin in names (``EarlyExit(target, k, reuse=False)``, which the selector
offers beside every exit that may hand its hidden states up: ``hierarchy.with_recomputing_exits``)."""


def exit_depth(name: str) -> int | None:
    """``K`` where ``name`` is ``exitK``, else None."""
    match = _EXIT_NAME.fullmatch(name)
    return int(match[1]) if match else None


def _zoo_records() -> dict[str, dict]:
    """The zoo manifest's model records by name; empty where there is no zoo (``run`` says so)."""
    from hsd_fast import zoo

    try:
        records = zoo.manifest().get("models")
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


def default_target() -> str:
    from hsd_fast import zoo

    return zoo.names()[-1]


def config_of(name: str) -> dict | None:
    """The config.json of a zoo model or checkpoint directory, unloaded; None for other names."""
    from hsd_fast import zoo

    if Path(name).is_dir():
        return read_config(Path(name) / "config.json")
    if name in _zoo_records():
        return read_config(zoo.zoo_dir() / name / "config.json")
    return None


def default_candidates(target: str) -> list[str]:
    """The lookup level, the zoo family's models smaller than ``target``, and where ``target`` was
    trained for early exits (its manifest record lists ``exit_weights``) its exits 1..L/2."""
    from hsd_fast import zoo

    records = _zoo_records()
    size = records.get(target, {}).get("params", float("inf"))
    smaller = [n for n in zoo.names() if n != target and records[n]["params"] < size]
    exits = []
    if "exit_weights" in records.get(target, {}).get("training", {}):
        layers = (config_of(target) or {}).get("num_hidden_layers", 0)
        exits = [f"exit{k}" for k in range(1, layers // 2 + 1)]
    return [LOOKUP, *smaller, *exits]


def named_models(target: str | None, candidates: list[str] | None) -> list[str]:
    """The names of the models a run loads (checkpoint directories and zoo models, the target last):
    neither the lookup level nor exits, which are the target's."""
    try:
        target = target or default_target()
        levels = candidates or default_candidates(target)
    except (OSError, ValueError):  # no zoo: the names given are all there is (``run`` says the rest)
        levels = candidates or []
    return [n for n in [*levels, target] if n and n != LOOKUP and exit_depth(n) is None]


def name_errors(
    target: str | None,
    candidates: list[str] | None,
    adapt: bool = False,
    flags: tuple[str, str] = ("--target", "--candidates"),
) -> list[str]:
    """What is wrong with the named levels, flag first (empty: nothing): every model a checkpoint
    directory or a zoo model; the default candidates (``candidates`` None) only for a zoo target on
    the shared tokenizer; at most one zoo draft on another tokenizer (none with ``adapt``); each exit
    inside the target, named once. ``flags``: the command's names for the target and the candidates."""
    records = _zoo_records()
    if not records:  # no zoo: run() says so
        return []
    family = ", ".join(sorted(records))
    errors = []
    target_flag, levels_flag = flags
    for flag, names in ((target_flag, [target] if target else []), (levels_flag, candidates or [])):
        for name in names:
            if flag == target_flag and exit_depth(name) is not None:
                errors.append(f"{target_flag} {name}: an exit is a draft level made of the target's layers")
            known = name == LOOKUP or exit_depth(name) is not None or name in records or Path(name).is_dir()
            if not known:
                errors.append(f"{flag} {name}: neither a checkpoint directory nor a zoo model ({family})")
    target = target or default_target()
    if target in records:
        own = records[target].get("tokenizer")
        if own is not None and candidates is None:
            errors.append(
                f"{target_flag} {target}: the default drafts, the zoo's family, are on the shared tokenizer, "
                f"not {target}'s: name its drafts ({levels_flag} lookup xxs4k), or let it draft for "
                f"the family ({levels_flag} {target})"
            )
        bridged = [n for n in candidates or [] if n in records and records[n].get("tokenizer") != own]
        errors += bridging_errors(bridged, target, adapt, levels_flag)
    exits = [n for n in candidates or [] if exit_depth(n) is not None]
    layers = (config_of(target) or {}).get("num_hidden_layers")
    for name in exits:
        if isinstance(layers, int) and not 1 <= exit_depth(name) < layers:
            last = f"exit{layers - 1}"
            errors.append(
                f"{levels_flag} {name}: the target {target} has {layers} layers: exits are exit1..{last}"
            )
    if len(set(exits)) < len(exits):
        errors.append(f"{levels_flag}: name each exit once")
    return errors


def bridging_errors(bridged: list[str], target: str, adapt: bool, flag: str = "--candidates") -> list[str]:
    """What is wrong with ``bridged``, the candidates (``flag``) on another tokenizer than ``target``'s:
    more than one (a hierarchy has one boundary), or any in an adaptive run (``adapt=`` takes none)."""
    errors = []
    if bridged and adapt:
        errors.append(f"--adapt: an adaptive run takes no draft with another tokenizer ({bridged[0]})")
    if len(bridged) > 1:
        names = ", ".join(bridged)
        errors.append(f"{flag}: at most one draft with another tokenizer than {target}'s ({names})")
    return errors


def candidate_levels(names: list[str], models: dict[str, torch.nn.Module], target: str) -> list:
    """The levels ``select_hierarchy`` takes for ``names``: the models, ``"lookup"`` as it is, each
    ``exitK`` as ``EarlyExit(models[target], K)``."""
    from hsd_fast.early_exit import EarlyExit

    def level(name: str):
        if exit_depth(name) is not None:
            return EarlyExit(models[target], exit_depth(name))
        return models.get(name, name)  # "lookup" as it is

    return [level(n) for n in names]


def load_model(name: str, dtype: torch.dtype | None = None, device: str = "cpu") -> torch.nn.Module:
    """A checkpoint directory's model (``AutoModelForCausalLM``; in its own dtype where ``dtype`` is
    None) or a zoo model (float32 where None), in eval mode."""
    from hsd_fast import zoo

    if Path(name).is_dir():
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(name, dtype=dtype or "auto").to(device).eval()
    return zoo.load(name, dtype, device)


def tokenizer_of(name: str):
    """The tokenizer of a zoo model or a checkpoint directory (None where the directory has none)."""
    from hsd_fast import zoo

    if not Path(name).is_dir():
        return zoo.load_tokenizer(name)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError):  # no tokenizer files: taken to be the target's
        return None


def text_tokenizer_of(name: str, target: torch.nn.Module, own):
    """The tokenizer that puts calibration text and prompts in ``target``'s ids: ``own``, the target's
    (``tokenizer_of(name)``), else (a directory without tokenizer files) the zoo's shared one, taken to
    be the target's where it embeds every id of it; a ValueError otherwise."""
    from hsd_fast import zoo

    if own is not None:
        return own
    shared = zoo.load_tokenizer()
    embedded = target.get_input_embeddings().num_embeddings
    if embedded < len(shared):
        raise ValueError(
            f"--target {name} has no tokenizer files, and its {embedded} embeddings are fewer than the zoo "
            f"tokenizer's {len(shared)} ids: save its tokenizer in that directory (tokenizer.save_pretrained)"
        )
    return shared


def level_name(level: object, models: dict[str, torch.nn.Module]) -> str:
    """The name a user would pass for a picked level: a model's (a draft with another tokenizer by
    its model's), ``lookup``, ``exitK`` (with ``RECOMPUTED`` where the selector chose the exit's
    recomputing twin)."""
    if isinstance(level, (str, LookupDraft)):
        return LOOKUP
    if isinstance(level, OtherTokenizerDraft):
        level = level.model
    found = exit_of(level)
    if found is not None:
        return f"exit{found[1]}" + ("" if reuses_hidden(level) else RECOMPUTED)
    return next(name for name, model in models.items() if model is level)
