"""No Python call crashes the ledger extension.

A ``Ledger`` whose C++ object was never constructed (``Ledger.__new__(Ledger)``, or the base's
``__new__``, which skip ``__init__``) used to segfault on its first method call. Every public
method and property must raise ``TypeError`` on one instead. Each check runs in a subprocess: a
regression is a failed test, not a dead test run. The subprocess loads the very module this process
imported (CI's sanitizer step imports an ASan/UBSan build in its place, and the subprocess inherits
the preloaded runtime).
"""

from __future__ import annotations

import subprocess
import sys

from hsd_fast import _C

# Arguments of the right types for every public method: the uninitialised ledger must fail on `self`
# ("never initialised"), not on them.
CALLS = {
    "seq_len": (0,),
    "committed_len": (0,),
    "pending": (0, 0),
    "last_tag": (0,),
    "tags": (0,),
    "finished": (0,),
    "output_len": (0,),
    "wanted_level": (0,),
    "frontiers": (),
    "cached_lens": (),
    "seq_lens": (),
    "output_lens": (),
    "eos_positions": (),
    "all_finished": (),
    "wanted_levels": (),
    "next_level": (),
    "rows_for": (0,),
    "spans": (0, [0, 1]),
    "commit_draft": ([0, 1], [0, 0]),
    "commit_proposal": ([0, 1], [0, 0], [0, 0]),
    "commit_verify": (1, [0], [0], [0]),
    "held": (0,),
    "holds": (),
    "hold": ([0],),
    "reconfigure": ([2], [0, 0, 0, 0]),
}
PROPERTIES = ("num_levels", "num_rows", "block_sizes", "policy")

SCRIPT = r"""
import copy
import importlib.util
import pickle
import sys

spec = importlib.util.spec_from_file_location("hsd_fast._C", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
Ledger = module.Ledger
CALLS, PROPERTIES = eval(sys.argv[2]), eval(sys.argv[3])

public = {name for name in dir(Ledger) if not name.startswith("_")}
assert public == set(CALLS) | set(PROPERTIES), f"update CALLS/PROPERTIES: {sorted(public)}"

def expect_type_error(what, action):
    try:
        action()
    except TypeError as err:
        assert "never initialised" in str(err), (what, str(err))
    else:
        raise AssertionError(f"{what}: no TypeError")

def check_all(ledger, how):
    for name, args in CALLS.items():
        expect_type_error(f"{how}.{name}", lambda: getattr(ledger, name)(*args))
        expect_type_error(f"Ledger.{name}({how})", lambda: getattr(Ledger, name)(ledger, *args))
    for name in PROPERTIES:
        expect_type_error(f"{how}.{name}", lambda: getattr(ledger, name))
    repr(ledger)

good = Ledger(2, [2], [3, 4], 5)
bare = Ledger.__new__(Ledger)
check_all(bare, "Ledger.__new__(Ledger)")
check_all(Ledger.__mro__[1].__new__(Ledger), "pybind11_object.__new__(Ledger)")

try:  # a failed __init__ leaves the instance bare, and still safe
    bare.__init__(0, [], [3], 5)
except ValueError:
    pass
check_all(bare, "failed __init__")
bare.__init__(2, [2], [3, 4], 5)  # __init__ on a bare instance constructs it
assert bare.frontiers().tolist() == [[3, 3], [4, 4]] and bare.num_rows == 2

class Sub(Ledger):
    def __init__(self):
        pass

for what, action in [
    ("copy", lambda: copy.copy(good)),
    ("deepcopy", lambda: copy.deepcopy(good)),
    ("pickle", lambda: pickle.dumps(good)),
    ("subclass without super().__init__", Sub),
]:
    try:
        action()
    except TypeError:
        pass
    else:
        raise AssertionError(f"{what}: no TypeError")
print("ledger ok")
"""


def test_uninitialised_ledger_raises_instead_of_crashing() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, _C.__file__, repr(CALLS), repr(PROPERTIES)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert "ledger ok" in done.stdout
