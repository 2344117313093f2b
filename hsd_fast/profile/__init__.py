"""Profiling what the latency model needs, one concern per module:

- ``costs``: forward costs through the engine's runner, ``c(n)`` fitted per model;
- ``acceptance_rates``: pairwise acceptance rates, teacher-forced;
- ``run_text``: the text they are measured on, the target's own continuations of calibration text;
- ``rank_acceptance``, ``proposal_replay``: the same for token trees and the lookup level;
- ``cache``: both, cached in JSON keyed by what was measured (``ProfileCache``);
- ``measure``: seconds per token of a hierarchy, end to end, through the ``generate`` it is given.

``hsd_fast.select_hierarchy`` (``hsd_fast.hierarchy``) puts them together.
"""

from hsd_fast.profile.acceptance_rates import acceptance
from hsd_fast.profile.cache import ProfileCache, ids_hash, model_identity, sampling_key
from hsd_fast.profile.costs import CostProfile, ProfileNoiseWarning, forward_costs
from hsd_fast.profile.measure import measured_latency

__all__ = [
    "CostProfile",
    "ProfileCache",
    "ProfileNoiseWarning",
    "acceptance",
    "forward_costs",
    "ids_hash",
    "measured_latency",
    "model_identity",
    "sampling_key",
]
