"""Early-exit levels: the target's own first ``k`` layers, then its final norm and LM head, as a
draft at any level of a hierarchy (LayerSkip's self-draft, stacked with other drafts).

``EarlyExit(target, k)`` returns an *exit view*: a model object of the target's own class whose
decoder-layer list holds the target's first ``k`` layer modules and whose config says ``k`` layers;
every other module (embedding, rotary embedding, final norm, head) is the target's own object. No
weight is copied and the target is not changed: its config is never edited (a compiled step has no
guard on config fields). Because the view is an ordinary model of a supported class, the runners,
compiled steps, profiler and selector treat it like any draft, with a K/V cache of its own. Its
runner calls a copy whose final norm is a ``HiddenTap`` (``with_hidden_tap``), keeping layer ``k``'s
output by cache slot: the level above then starts its verification at layer ``k`` from those hidden
states instead of recomputing layers ``< k`` (``exit_reuse.py``; docs/design.md, "Early-exit levels").
"""

from __future__ import annotations

import copy
import weakref

import torch

# target -> {(k, reuse): view}. A view holds the target's modules, not the target itself, so the weak key
# lets the target (and its views) go when the user drops it. Equal arguments give the same view, so
# its runner and compiled steps serve every later call.
_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# view -> (weak reference to its target, k, reuse): what `exit_of` and `reuses_hidden` report.
_ORIGINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def EarlyExit(target: torch.nn.Module, k: int, *, reuse: bool = True) -> torch.nn.Module:
    """The draft level made of ``target``'s first ``k`` layers (1 <= k < its layer count) followed by
    its final norm and head: put it in ``drafts=`` like any draft model, e.g.
    ``drafts=["lookup", small, hsd_fast.EarlyExit(target, 2)]``; several exits stack smallest ``k``
    first. ``reuse``: the level above (the target, or a deeper exit) starts its verification from
    this exit's hidden states where the model allows it (``hsd-fast doctor`` says), instead of
    recomputing layers ``< k``; False always recomputes. Calls with the same arguments return the
    same object."""
    layers = num_layers(target)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < layers:
        raise ValueError(
            f"EarlyExit: k must be an int in 1..{layers - 1} (the target has {layers} layers; k = "
            f"{layers} would be the target itself), got {k!r}"
        )
    views = _VIEWS.setdefault(target, {})
    key = (k, bool(reuse))
    if key not in views:
        view = layer_view(target, 0, k)
        _ORIGINS[view] = (weakref.ref(target), k, bool(reuse))
        views[key] = view
    return views[key]


def exit_of(model: torch.nn.Module) -> tuple[torch.nn.Module, int] | None:
    """``(target, k)`` when ``model`` is an exit view made by ``EarlyExit``, else None."""
    origin = _ORIGINS.get(model)
    if origin is None:
        return None
    target = origin[0]()
    return None if target is None else (target, origin[1])


def reuses_hidden(model: torch.nn.Module) -> bool:
    """Whether ``model`` is an exit view whose hidden states the level above may start from (made
    with ``reuse=True``, the default)."""
    origin = _ORIGINS.get(model)
    return origin is not None and origin[2]


def recomputing_variant(model: object) -> torch.nn.Module | None:
    """``EarlyExit(target, k, reuse=False)`` for an exit view made with ``reuse=True``: the same
    level, its verifier recomputing layers ``< k``; None for anything else. The selector offers both
    and keeps the cheaper (``hierarchy.with_recomputing_exits``)."""
    origin = _ORIGINS.get(model) if isinstance(model, torch.nn.Module) else None
    target = origin[0]() if origin is not None and origin[2] else None
    return None if target is None else EarlyExit(target, origin[1], reuse=False)


def num_layers(model: torch.nn.Module) -> int:
    layers = getattr(model.config, "num_hidden_layers", None)
    if not isinstance(layers, int):
        raise ValueError(f"EarlyExit: {type(model).__name__}'s config names no num_hidden_layers")
    return layers


def decoder_layers_path(model: torch.nn.Module) -> str:
    """The dotted name of ``model``'s decoder-layer list: the shallowest ``ModuleList`` holding
    ``num_hidden_layers`` modules (``model.layers`` in Llama, ``transformer.h`` in GPT-2)."""
    layers = num_layers(model)
    found = [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.ModuleList) and len(module) == layers and name
    ]
    if not found:
        raise ValueError(
            f"EarlyExit: no list of {layers} decoder layers found in {type(model).__name__}: its layers "
            "cannot be split"
        )
    return min(found, key=lambda name: (name.count("."), name))


def check_exit_order(drafts: list) -> None:
    """Exits of one target stand in the hierarchy smallest ``k`` first (a deeper exit verifies a
    shallower one, never the reverse): ValueError naming the entries otherwise."""
    deepest: dict[int, tuple[int, int]] = {}  # id(target) -> (index, k) of the last exit seen
    for i, level in enumerate(drafts):
        origin = exit_of(level) if isinstance(level, torch.nn.Module) else None
        if origin is None:
            continue
        target, k = origin
        previous = deepest.get(id(target))
        if previous is not None and previous[1] >= k:
            raise ValueError(
                f"drafts[{i}] is EarlyExit(target, {k}) above drafts[{previous[0]}], EarlyExit(target, "
                f"{previous[1]}): exits of one target go smallest k first"
            )
        deepest[id(target)] = (i, k)


FINAL_NORM_NAMES = ("norm", "ln_f", "final_layernorm", "final_layer_norm", "norm_f", "final_norm")
"""Where a decoder's final norm sits beside its layer list (Llama ``model.norm``, GPT-2
``transformer.ln_f``, ...): what ``with_hidden_tap`` wraps."""


class HiddenTap(torch.nn.Module):
    """A final norm that first hands its input, the last layer's output ``[B, L, H]``, to
    ``sink.keep_hidden``: the exit runner, which keeps it by the slots its forward writes K/V to."""

    def __init__(self, norm: torch.nn.Module, sink) -> None:
        super().__init__()
        self.norm, self.sink = norm, sink

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        self.sink.keep_hidden(hidden_states)
        return self.norm(hidden_states, *args, **kwargs)


def _decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The module holding the decoder-layer list (and the final norm beside it)."""
    return model.get_submodule(decoder_layers_path(model).rpartition(".")[0])


def final_norm_name(model: torch.nn.Module) -> str | None:
    """The name of the decoder's final norm beside its layer list, None if none has a known name."""
    children = _decoder(model)._modules
    return next((n for n in FINAL_NORM_NAMES if isinstance(children.get(n), torch.nn.Module)), None)


def with_hidden_tap(model: torch.nn.Module, sink) -> torch.nn.Module:
    """A view of ``model`` (every module its own but those on the path to the decoder, shallow
    copies) whose final norm is a ``HiddenTap`` handing its input to ``sink``. The runner of an
    exit calls this copy, so that the exit view a user holds (and the profiler times) stays the
    plain model. ValueError when the final norm has no known name."""
    name = final_norm_name(model)
    if name is None:
        raise ValueError(f"{type(model).__name__}: no final norm under {FINAL_NORM_NAMES}")
    path = decoder_layers_path(model).rpartition(".")[0]
    copies = _copy_path(model, path.split(".") if path else [])
    copies[-1]._modules[name] = HiddenTap(copies[-1]._modules[name], sink)
    return copies[0]


def layer_view(model: torch.nn.Module, start: int, stop: int) -> torch.nn.Module:
    """A copy of ``model``'s module tree down to its decoder-layer list (each module on the path a
    shallow copy, so the model's own tree is untouched), with the list cut to layers
    ``[start, stop)`` and the copies' config saying ``stop - start`` layers of their types. Modules
    below the path are the model's objects; a layer keeps its own index into the cache."""
    path = decoder_layers_path(model).split(".")
    config = _cut_config(model.config, start, stop)
    copies = _copy_path(model, path[:-1])
    parent = copies[-1]
    parent._modules[path[-1]] = torch.nn.ModuleList(list(parent._modules[path[-1]])[start:stop])
    for module in copies:
        if getattr(module, "config", None) is model.config:
            module.config = config  # the layer loop and the cache read the layer count here
    return copies[0]


def _copy_path(model: torch.nn.Module, names: list[str]) -> list[torch.nn.Module]:
    """Shallow copies of ``model`` and of each module on the path ``names`` below it, each copy the
    child of the one before: the view, then the path down to the module to edit."""
    copies = [_shallow_copy(model)]
    for name in names:
        copies.append(_shallow_copy(copies[-1]._modules[name]))
        copies[-2]._modules[name] = copies[-1]
    return copies


def _cut_config(config, start: int, stop: int):
    config = copy.deepcopy(config)
    config.num_hidden_layers = stop - start
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[start:stop]  # the mask per layer type follows the layers
    return config


def _shallow_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A new module object of the same class sharing every parameter, buffer and child, with its
    own registries and hook tables (replacing a child of the copy leaves the original alone, and a
    hook registered on one does not run for the other; hooks the original had run for both)."""
    clone = object.__new__(type(module))
    clone.__dict__ = {
        name: copy.copy(value) if isinstance(value, (dict, set)) else value
        for name, value in module.__dict__.items()
    }
    return clone
