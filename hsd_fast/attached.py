"""Caches kept on the object they belong to (docs/design.md, "Caches and slots").

A model's runner holds the model, and its compiled steps hold the runner. Kept in a module-level
``WeakKeyDictionary`` keyed by the model, such a value keeps its own key alive (the dictionary holds
the value strongly), so no model that ever ran would be freed, with every compiled graph it has (on a
CPU each holds a copy of the weights). Kept on the model instead, the cache and the model form a cycle
that the garbage collector frees together once the user drops the model.

A copy of the owner (``copy.copy``, ``copy.deepcopy``, pickling) starts with no cache: its runner must
hold the copy, not the original."""

from __future__ import annotations

import weakref
from typing import Any

_ATTRIBUTE = "_hsd_fast_caches"
_ELSEWHERE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # owners without a __dict__


class _Caches(dict):
    """One owner's caches, by name; copies of it are empty plain dicts (see ``attached``)."""

    def __init__(self, owner: object) -> None:
        super().__init__()
        self.owner = weakref.ref(owner)

    def __copy__(self) -> dict:
        return {}

    def __deepcopy__(self, memo: dict) -> dict:
        return {}

    def __reduce__(self) -> tuple:
        return (dict, ())


def attached(owner: object, name: str) -> dict[Any, Any]:
    """The dict named ``name`` that lives on ``owner`` (made empty on first use). An owner whose
    ``__dict__`` holds another object's caches (a shallow copy made by hand) gets its own."""
    state = getattr(owner, "__dict__", None)
    if state is None:  # no place on the object: a weak table, which frees it only if no value holds it
        return _ELSEWHERE.setdefault(owner, {}).setdefault(name, {})
    caches = state.get(_ATTRIBUTE)
    if not isinstance(caches, _Caches) or caches.owner() is not owner:
        caches = state[_ATTRIBUTE] = _Caches(owner)
    return caches.setdefault(name, {})
