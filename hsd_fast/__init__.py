"""hsd_fast: Hierarchical Speculative Decoding (arXiv 2510.19705) with the target's exact output
distribution. See docs/design.md (the design) and README.md (set-up, layout)."""

from __future__ import annotations

try:
    from hsd_fast import _C  # noqa: F401  (the C++ ledger; the package cannot work without it)
except ImportError as err:  # pragma: no cover - exercised only by broken installs
    raise ImportError(
        "hsd_fast: the compiled extension hsd_fast._C is missing. Install the package with "
        "`pip install -e .` (development) or `pip install .` and import it from outside the "
        "repository: a regular install imported from the repository root picks up the source tree, "
        f"which holds no compiled extension. ({err})"
    ) from err

from hsd_fast.engine import HSDResult, run_hsd
from hsd_fast.lookup import LookupDraft
from hsd_fast.stats import HSDStats
from hsd_fast.steps import Runner
from hsd_fast.switching import ExploreThenCommit
from hsd_fast.switching_types import Adaptive, Choice, Observation
from hsd_fast.tree import Tree

__version__ = "0.1.0"
__all__ = [
    "Adaptive",
    "Choice",
    "EarlyExit",
    "ExploreThenCommit",
    "HSDGenerateOutput",
    "HSDModel",
    "HSDResult",
    "HSDStats",
    "Hierarchy",
    "LookupDraft",
    "Observation",
    "OtherTokenizerDraft",
    "Runner",
    "Tree",
    "__version__",
    "generate",
    "run_hsd",
    "select_hierarchy",
    "wrap",
]


def __getattr__(name: str):
    # Loaded on first use, each from the module that defines it: transformers is imported only by the
    # HF glue, and the selection stack (profiler, latency model) only by `select_hierarchy`.
    if name in ("generate", "HSDGenerateOutput"):
        from hsd_fast import hf_generate as module
    elif name in ("wrap", "HSDModel"):
        from hsd_fast import wrapper as module
    elif name == "select_hierarchy":
        from hsd_fast import hierarchy as module
    elif name == "EarlyExit":
        from hsd_fast import early_exit as module
    elif name == "OtherTokenizerDraft":
        from hsd_fast import other_tokenizer as module
    elif name == "Hierarchy":
        from hsd_fast import hierarchy_types as module
    else:
        raise AttributeError(f"module 'hsd_fast' has no attribute {name!r}")
    value = globals()[name] = getattr(module, name)
    return value
