"""Early-exit levels: the target's own first ``k`` layers, then its final norm and LM head, as a
draft at any level of a hierarchy (LayerSkip's self-draft, stacked with other drafts).

``EarlyExit(target, k)`` returns an *exit view*: a model object of the target's own class whose
decoder-layer list holds the target's first ``k`` layer modules and whose config says ``k`` layers;
every other module (embedding, rotary embedding, final norm, head) is the target's own object. No
weight is copied and the target is not changed: its config is never edited (a compiled step has no
guard on config fields). Because the view is an ordinary model of a supported class, the runners,
compiled steps, profiler and selector treat it like any draft; it has a K/V cache of its own, so the
target's first ``k`` layers are recomputed when the target verifies (docs/design.md, "Early-exit
levels": what sharing that work would take).
"""

from __future__ import annotations

import copy
import weakref

import torch

# target -> {k: view}. A view holds the target's modules, not the target itself, so the weak key
# lets the target (and its views) go when the user drops it. Equal arguments give the same view, so
# its runner and compiled steps serve every later call.
_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# view -> (weak reference to its target, k): what `exit_of` reports.
_ORIGINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def EarlyExit(target: torch.nn.Module, k: int) -> torch.nn.Module:
    """The draft level made of ``target``'s first ``k`` layers (1 <= k < its layer count) followed by
    its final norm and head: put it in ``drafts=`` like any draft model, e.g.
    ``drafts=["lookup", small, hsd_fast.EarlyExit(target, 2)]``; several exits stack smallest ``k``
    first. Calls with the same target and ``k`` return the same object."""
    layers = num_layers(target)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < layers:
        raise ValueError(
            f"EarlyExit: k must be an int in 1..{layers - 1} (the target has {layers} layers; k = "
            f"{layers} would be the target itself), got {k!r}"
        )
    views = _VIEWS.setdefault(target, {})
    if k not in views:
        view = _exit_view(target, k)
        _ORIGINS[view] = (weakref.ref(target), k)
        views[k] = view
    return views[k]


def exit_of(model: torch.nn.Module) -> tuple[torch.nn.Module, int] | None:
    """``(target, k)`` when ``model`` is an exit view made by ``EarlyExit``, else None."""
    origin = _ORIGINS.get(model)
    if origin is None:
        return None
    target = origin[0]()
    return None if target is None else (target, origin[1])


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


def _exit_view(target: torch.nn.Module, k: int) -> torch.nn.Module:
    """A copy of ``target``'s module tree down to its decoder-layer list (each module on the path a
    shallow copy, so the target's own tree is untouched), with the list cut to ``k`` and the copies'
    config saying ``k`` layers. Modules below the path are the target's objects."""
    path = decoder_layers_path(target).split(".")
    config = _exit_config(target.config, k)
    copies = [_shallow_copy(target)]  # the view, then each module on the path to the layer list
    for name in path[:-1]:
        copies.append(_shallow_copy(copies[-1]._modules[name]))
        copies[-2]._modules[name] = copies[-1]
    parent = copies[-1]
    parent._modules[path[-1]] = torch.nn.ModuleList(list(parent._modules[path[-1]])[:k])
    for module in copies:
        if getattr(module, "config", None) is target.config:
            module.config = config  # the layer loop and the cache read the layer count here
    return copies[0]


def _exit_config(config, k: int):
    config = copy.deepcopy(config)
    config.num_hidden_layers = k
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:k]  # the mask per layer type follows the kept layers
    return config


def _shallow_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A new module object of the same class sharing every parameter, buffer and child, with its
    own registries (replacing a child of the copy leaves the original alone)."""
    clone = object.__new__(type(module))
    clone.__dict__ = dict(module.__dict__)
    for registry in ("_modules", "_parameters", "_buffers"):
        clone.__dict__[registry] = dict(module.__dict__[registry])
    return clone
