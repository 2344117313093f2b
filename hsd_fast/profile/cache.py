"""Measured forward costs and acceptance rates, cached in JSON across runs and machines.

Keys name what was measured: a cost by model identity (a hash of the weights), device, dtype,
context length and the timing environment (``costs.timing_environment``: the entry's version, the
torch release, the CPU threads or the GPU), and a cost entry holds the anchor workload's time
(``costs.anchor_seconds``), so that one timed on a machine running at another speed is timed again
(a fallback's entry, shipped and timed elsewhere, is scaled by the anchor's ratio instead: re-timing
every model's compiled steps on each run that reads it would cost minutes and store nothing);
rates measured on the text a run meets (``run_text``: the target's continuations of the
calibration ids, as long as the run) by what they compare and by that text (the target's identity,
the sampling transform, the hash of the calibration ids, the length when not the default): an
acceptance rate by the unordered pair of identities, a rank acceptance by the draft and the
verifier, a lookup level's profile (``proposal_replay``) by its n-gram sizes and largest block, with
the model identity for the rates a model accepts it with, and the device for its host cost.
The text is generated once per cache. ``fallbacks`` (e.g. the zoo's committed CPU profile) are read
but never written.

A cache file is never fatal: one that is not this cache's JSON (corrupt, truncated, foreign) is
named in a warning and moved aside to ``<name>.corrupt-<timestamp>``, and the run goes on without
it; such a fallback is skipped with a warning. An entry in another format (an older version's) is
measured again when it is looked up. ``save`` writes only when something was measured, atomically
(a temporary file in the same directory, then ``os.replace``: a concurrent reader or a crash never
sees half a file), and a failed write (a read-only home) is a warning.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from hsd_fast import proposal_scores
from hsd_fast.early_exit import exit_of
from hsd_fast.exit_reuse import refusal
from hsd_fast.files import write_atomically
from hsd_fast.latency import Acceptance, BridgedCost, DepthRates, LookupCost, RatesThrough
from hsd_fast.lookup import PROPOSAL_RULE, LookupDraft
from hsd_fast.processors import LogitsTransform
from hsd_fast.profile import proposal_replay, rank_acceptance, run_text
from hsd_fast.profile.acceptance_rates import (
    acceptance_and_spread,
    teacher_forced_logits,
    teacher_forced_scores,
)
from hsd_fast.profile.costs import (
    ANCHOR_TOLERANCE,
    CostProfile,
    anchor_seconds,
    forward_costs,
    reuse_costs,
    timing_environment,
    without_layers,
)
from hsd_fast.proposal_level import ProposalLevel
from hsd_fast.row_spread import ProposalRows


def model_identity(model: torch.nn.Module) -> str:
    """A short hash of the weights as loaded (class, parameter names, shapes, dtype and a strided
    sample of every parameter): the same checkpoint gives the same key on every machine."""
    digest = hashlib.sha256(type(model).__name__.encode())
    for name, p in sorted(model.named_parameters()):
        flat = p.detach().flatten()
        sample = flat[:: max(1, flat.numel() // 4096)].float().cpu().numpy()
        digest.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
        digest.update(sample.tobytes())
    return digest.hexdigest()[:16]


def tokenizer_identity(tokenizer) -> str:
    """A short hash of a tokenizer's vocabulary (token strings and ids)."""
    return hashlib.sha256(json.dumps(sorted(tokenizer.get_vocab().items())).encode()).hexdigest()[:16]


def ids_hash(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.to(torch.int64).cpu().numpy().tobytes()).hexdigest()[:16]


def sampling_key(transform: LogitsTransform, greedy: bool) -> str:
    """``"greedy"``, or ``"sample "`` followed by the transform's settings."""
    return "greedy" if greedy else f"sample {transform.key}"


class ProfileCacheWarning(UserWarning):
    """A cache file could not be read or written; the run goes on without it."""


COST_FIELDS = ("spans", "seconds", "drafts", "draft_seconds")
MAX_REUSED_NOISE = 0.4
"""A cached cost noisier than this (``CostProfile.noise``, the largest relative standard error of its
medians) was timed on a busy machine: it is timed again when looked up, not reused. Quiet runs of the
zoo's steps measure 0.02-0.18 on the 2-core CPU; runs beside other jobs 0.6-0.7 (docs/design.md,
"Measuring costs on a busy machine")."""


def _is_number(value: object) -> bool:
    """A finite, non-negative int or float: what every measured quantity here is (seconds, token
    counts, noise, rates). A NaN, an infinity or a negative value (a hand edit, another tool) makes
    its entry unusable: it is measured again rather than fitted into a zero cost."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf


def _is_rate(value: object) -> bool:
    return _is_number(value) and value <= 1


# a pairwise entry's kind (``ProfileCache._pairwise``): how a cached value is checked, and the
# matrix's diagonal (a model against itself: it accepts all it drafts, its rows alike)
_PAIRWISE = {"alpha": (_is_rate, 1.0), "spread": (_is_number, 0.0)}


def _usable_cost(entry: object) -> bool:
    """A cost entry as ``costs`` writes it: four lists of numbers, spans and seconds as long as each
    other, drafts and draft_seconds too, and the noise of its medians. Anything else (a hand edit,
    an older version's format: entries without ``noise`` were timed before every step was warmed up
    until its time settled, and compiled ones hold compilation times) is measured again and
    replaced when it is looked up."""
    if not isinstance(entry, dict) or not all(isinstance(entry.get(f), list) for f in COST_FIELDS):
        return False
    if not _is_number(entry.get("noise")):
        return False
    if not all(_is_number(v) for f in COST_FIELDS for v in entry[f]):
        return False
    return len(entry["spans"]) == len(entry["seconds"]) and len(entry["drafts"]) == len(
        entry["draft_seconds"]
    )


def _cost_entry(profile: CostProfile) -> dict:
    return {field: list(getattr(profile, field)) for field in COST_FIELDS} | {"noise": profile.noise}


def _cost_profile(entry: dict) -> CostProfile:
    return CostProfile(*(tuple(entry[field]) for field in COST_FIELDS), entry["noise"])


def _scaled(profile: CostProfile, ratio: float) -> CostProfile:
    return replace(
        profile,
        seconds=tuple(t * ratio for t in profile.seconds),
        draft_seconds=tuple(t * ratio for t in profile.draft_seconds),
    )


def read_entries(path: Path) -> dict:
    """The entries of a cache file; ``ValueError`` (saying what is wrong) if it is not one: not
    JSON, or not ``{"entries": {str: ...}}``. Entries are checked where they are used."""
    try:
        data = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"not JSON ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise ValueError('not a profile cache: expected {"entries": {...}}')
    return data["entries"]


class ProfileCache:
    """Costs and acceptance rates, measured on first request and kept in ``path`` (JSON)."""

    def __init__(self, path: Path | None = None, fallbacks: Sequence[Path] = ()) -> None:
        self.path = Path(path) if path is not None else None
        self.entries: dict = {}
        self.changed = False  # something was measured since the files were read
        self.writable = self.path is not None  # False where the file must be left alone
        self._texts: dict[str, torch.Tensor] = {}  # the run's text per _text_key, generated once
        self._anchors: dict[str, float] = {}  # anchor_seconds per device type, timed once
        self._shipped: set[str] = set()  # keys whose entry comes from a fallback
        for source in fallbacks:
            self._read(Path(source), fallback=True)
        if self.path is not None:
            self._read(self.path, fallback=False)

    def _read(self, source: Path, fallback: bool) -> None:
        if not source.is_file():
            return
        try:
            entries = read_entries(source)
        except OSError as err:  # unreadable: leave the file alone, and never overwrite it
            _warn(f"cannot read the profile {source} ({err}); going on without it")
            self.writable = self.writable and fallback
            return
        except ValueError as err:
            if fallback:
                _warn(f"ignoring the profile {source}: {err}")
                return
            aside = _aside(source)
            try:
                os.replace(source, aside)
            except OSError as move_err:
                _warn(
                    f"the profile cache {source} is unusable ({err}) and cannot be moved aside "
                    f"({move_err}); going on with an empty cache that is not saved"
                )
                self.writable = False
                return
            _warn(f"the profile cache {source} is unusable ({err}); moved it to {aside}, starting empty")
            return
        self.entries.update(entries)
        if fallback:
            self._shipped.update(entries)
        else:
            self._shipped.difference_update(entries)

    def save(self) -> None:
        """Write the entries to ``path`` if anything was measured since they were read: atomically,
        and a failure (read-only directory, full disk) is a warning, not an error."""
        if self.path is None or not self.writable or not self.changed:
            return
        text = json.dumps({"entries": self.entries}, indent=1, sort_keys=True) + "\n"
        try:
            write_atomically(self.path, text)
        except OSError as err:
            _warn(f"cannot save the profile cache {self.path} ({err}); the new measurements are lost")
            return
        self.changed = False

    def costs(
        self,
        model: torch.nn.Module,
        context: int,
        compile: bool = False,
        transform: LogitsTransform | None = None,
        greedy: bool = True,
        batch: int = 1,
        crowd_bytes: int = 0,
        below: torch.nn.Module | None = None,
        **kwargs,
    ) -> CostProfile:
        """``model``'s step costs at ``context`` cached tokens, on the path ``generate`` takes
        (compiled or not, greedy or sampled under ``transform``), for ``batch`` rows; with
        ``crowd_bytes`` (the other candidates' weights), also timed after that much memory went
        through the cache (``CostProfile.crowded``). With ``below``, an early exit of ``model``: its
        verification steps from the exit's hidden states (``reuse_costs``; no draft steps)."""
        transform = transform or LogitsTransform()
        compile = compile and not transform.needs_prefixes  # processors called per position run eagerly
        p = next(model.parameters())
        identity = model_identity(model)
        identity = identity if below is None else f"{model_identity(below)}>{identity}"  # a pair's
        key = (
            f"cost {identity} {p.device.type} {str(p.dtype).removeprefix('torch.')} {context} "
            f"{'compiled' if compile else 'eager'} {sampling_key(transform, greedy)}{_batch_key(batch)}"
            f"{f' crowd {crowd_bytes}' if crowd_bytes else ''} [{timing_environment(p.device)}]"
        )
        clock = kwargs.get("clock", time.perf_counter)
        entry = self.entries.get(key)
        usable = (
            _usable_cost(entry)
            and entry["noise"] <= MAX_REUSED_NOISE
            and (not crowd_bytes or _usable_cost(entry.get("crowded")))
        )
        shipped = usable and key in self._shipped and _is_number(entry.get("anchor"))
        if not shipped and not (usable and self._same_speed(entry, p.device, clock)):
            profile = (forward_costs if below is None else functools.partial(reuse_costs, exit_model=below))(
                model,
                context=context,
                compile=compile,
                greedy=greedy,
                transform=transform,
                batch=batch,
                crowd_bytes=crowd_bytes,
                **kwargs,
            )
            self.entries[key] = _cost_entry(profile) | {"anchor": self._anchor(p.device, clock)}
            if profile.crowded is not None:
                self.entries[key]["crowded"] = _cost_entry(profile.crowded)
            self.changed = True
        entry = self.entries[key]
        # a fallback's times scaled by how much faster or slower the anchor runs here and now than
        # where they were timed: a uniform speed change leaves the pick as it was and the predicted
        # speed right (module doc)
        scale = self._anchor(p.device, clock) / entry["anchor"] if shipped else 1.0
        crowded = _scaled(_cost_profile(entry["crowded"]), scale) if crowd_bytes else None
        return replace(_scaled(_cost_profile(entry), scale), crowded=crowded)

    def with_exit_reuse(
        self, models: Sequence[torch.nn.Module], costs: Sequence[CostProfile], crowds: Sequence[int], **kwargs
    ) -> list[CostProfile]:
        """``costs`` (one per model of ``models``, as ``costs`` timed them with ``kwargs``) with each
        early exit's ``reused_by`` filled in, for every other model that verifies it from its hidden
        states (``exit_reuse.refusal``): that model's cost and what such a verification costs. The
        target's is timed (``costs(target, below=exit)``, with the target's ``crowds`` entry); a deeper
        exit's is derived from it (``without_layers``: the target's minus the layers the deeper exit
        lacks), which saves compiling a step per pair of exits. Deeper exits first, so a shallow exit
        names the final cost object of a deeper exit above it."""
        out = list(costs)
        origin = [exit_of(m) for m in models]
        for low in sorted(range(len(models)), key=lambda i: -(origin[i] or (None, 0))[1]):
            if origin[low] is None:
                continue
            target = next((i for i, m in enumerate(models) if m is origin[low][0]), None)
            if target is None or refusal(models[low], models[target]) is not None:
                continue
            timed = self.costs(models[target], crowd_bytes=crowds[target], below=models[low], **kwargs)
            deeper = [
                i
                for i, o in enumerate(origin)
                if o is not None and o[0] is origin[low][0] and refusal(models[low], models[i]) is None
            ]
            reused = [(out[target], timed)]
            reused += [(out[i], without_layers(timed, costs[target], costs[i])) for i in deeper]
            out[low] = replace(out[low], reused_by=tuple(reused))
        return out

    def _anchor(self, device: torch.device, clock) -> float:
        """``anchor_seconds`` on ``device``, timed once per cache (per process, in practice)."""
        if device.type not in self._anchors:
            self._anchors[device.type] = anchor_seconds(device, clock)
        return self._anchors[device.type]

    def _same_speed(self, entry: dict, device: torch.device, clock) -> bool:
        """Whether ``entry`` was timed on a machine running the anchor workload at this one's speed
        now (within ``ANCHOR_TOLERANCE``); if not, a warning says its costs are timed again."""
        then, now = entry.get("anchor"), self._anchor(device, clock)
        if not _is_number(then):  # an entry from before anchors: timed again
            return False
        if then == now or abs(now - then) <= ANCHOR_TOLERANCE * then:
            return True
        _warn(
            f"a cached step cost was timed where the anchor workload took {then * 1e6:.0f} us; here and "
            f"now it takes {now * 1e6:.0f} us: timing the steps again (costs do not carry across machines)"
        )
        return False

    def acceptance(
        self,
        models: Sequence[torch.nn.Module],
        ids: torch.Tensor,
        transform: LogitsTransform,
        greedy: bool,
        progress: bool = True,
        generation_kwargs: dict | None = None,
        new_tokens: int | None = None,
    ) -> list[list[float]]:
        """The pairwise acceptance rates of ``models`` (the target last) over the contexts a run
        meets: the target's own continuations of ``ids``, ``new_tokens`` long (the run's length;
        default half a row), under ``generation_kwargs`` (the run's sampling settings;
        ``run_text``)."""
        args = (models, ids, transform, greedy, progress, generation_kwargs, new_tokens)
        return self._pairwise(("alpha",), *args)[0]

    def acceptance_and_spread(
        self,
        models: Sequence[torch.nn.Module],
        ids: torch.Tensor,
        transform: LogitsTransform,
        greedy: bool,
        progress: bool = True,
        generation_kwargs: dict | None = None,
        new_tokens: int | None = None,
    ) -> tuple[list[list[float]], list[list[float]]]:
        """``acceptance`` and each pair's spread over the rows of ``ids`` (``row_spread``): what a
        batch's replay needs, the rows' rates apart as the calibration's texts are."""
        args = (models, ids, transform, greedy, progress, generation_kwargs, new_tokens)
        alpha, spread = self._pairwise(("alpha", "spread"), *args)
        return alpha, spread

    def _pairwise(
        self,
        kinds: tuple[str, ...],
        models: Sequence[torch.nn.Module],
        ids: torch.Tensor,
        transform: LogitsTransform,
        greedy: bool,
        progress: bool,
        generation_kwargs: dict | None,
        new_tokens: int | None,
    ) -> list[list[list[float]]]:
        """One symmetric matrix per kind (``alpha``: the rates, ``spread``: the spreads),
        cached under each unordered pair; any missing costs the forwards of both."""
        names = [model_identity(m) for m in models]
        text = self._text_key(models[-1], ids, transform, greedy, new_tokens)
        pairs = list(itertools.combinations(range(len(models)), 2))
        keys = {
            kind: {(j, m): f"{kind} {' '.join(sorted((names[j], names[m])))} on {text}" for j, m in pairs}
            for kind in kinds
        }
        if not all(
            _PAIRWISE[kind][0](self.entries.get(key)) for kind in kinds for key in keys[kind].values()
        ):
            text_ids = self._run_text(models[-1], ids, text, generation_kwargs, new_tokens)
            contexts = run_text.run_contexts(run_text.continuation_start(ids), text_ids.shape[1])
            alpha, spread = acceptance_and_spread(
                models, text_ids, transform, greedy, progress, contexts=contexts
            )
            measured = {"alpha": alpha, "spread": spread}
            for kind in kinds:
                self.entries.update({key: measured[kind][j][m] for (j, m), key in keys[kind].items()})
            self.changed = True
        out = []
        for kind in kinds:
            matrix = [[_PAIRWISE[kind][1]] * len(models) for _ in models]
            for (j, m), key in keys[kind].items():
                matrix[j][m] = matrix[m][j] = self.entries[key]
            out.append(matrix)
        return out

    def rank_acceptance(
        self,
        models: Sequence[torch.nn.Module],
        pairs: Sequence[tuple[int, int]],
        ids: torch.Tensor,
        transform: LogitsTransform,
        greedy: bool,
        max_rank: int,
        progress: bool = True,
        generation_kwargs: dict | None = None,
        new_tokens: int | None = None,
    ) -> dict[tuple[int, int], tuple[float, ...]]:
        """Rank acceptance (``profile.rank_acceptance``) of ``models[d]`` drafting token trees under
        ``models[m]`` for every ``(d, m)`` of ``pairs``, over the contexts a run meets (as
        ``acceptance``; ``models[-1]`` is the target). Each model's logits are computed once for all
        the pairs it is in."""
        names = {i: model_identity(models[i]) for pair in pairs for i in pair}  # models only, no lookup
        text = self._text_key(models[-1], ids, transform, greedy, new_tokens)
        keys = {(d, m): f"ranks {max_rank} {names[d]} on {names[m]} in {text}" for d, m in pairs}
        missing = [pair for pair, key in keys.items() if not _rates(self.entries.get(key))]
        if missing:
            text_ids = self._run_text(models[-1], ids, text, generation_kwargs, new_tokens)
            contexts = run_text.run_contexts(run_text.continuation_start(ids), text_ids.shape[1])
            vocab = models[-1].get_output_embeddings().weight.shape[0]  # the target's
            needed = sorted({i for pair in missing for i in pair})
            logits = {
                i: teacher_forced_logits(models[i], text_ids, transform, vocab, contexts)
                for i in tqdm(needed, desc="rank acceptance forwards", disable=not progress)
            }
            for d, m in missing:
                rates = rank_acceptance.rank_acceptance_of_logits(
                    logits[d], logits[m].to(logits[d].device), max_rank, transform.temperature, greedy
                )
                self.entries[keys[(d, m)]] = list(rates)
            self.changed = True
        return {pair: tuple(self.entries[key]) for pair, key in keys.items()}

    def proposal_level(
        self,
        spec: ProposalLevel,
        models: Sequence[torch.nn.Module],
        ids: torch.Tensor,
        transform: LogitsTransform,
        greedy: bool,
        max_T: int,
        progress: bool = True,
        generation_kwargs: dict | None = None,
        batch: int = 1,
        new_tokens: int | None = None,
        compile: bool = False,
        **timing,
    ) -> tuple[LookupCost, list[Acceptance]]:
        """A proposal level's cost for ``batch`` rows and the rates per position at which each of
        ``models`` (the target last) accepts its proposals, replayed on the target's own
        continuations of ``ids`` under ``generation_kwargs`` (the run's sampling settings). A lookup
        level (``LookupDraft``): host seconds per call, lengths offered. A draft with another
        tokenizer (``OtherTokenizerDraft``, replayed with its own proposals through the byte bridge):
        the seconds of a call for every block size 1..``max_T`` (its model drafts more for a larger
        block), ``compile``d or not as the runs selected for (``BridgedCost``)."""
        kind, level, replayed_as = _proposal_key(spec, greedy, max_T)
        lengths, rates, *_ = self._replayed(
            spec, kind, replayed_as, models, ids, transform, greedy, max_T, progress, generation_kwargs,
            new_tokens,
        )  # fmt: skip
        cost_key = f"{kind} cost {level} {ids.device.type}"
        if kind == "lookup":  # host work only: compiling changes nothing
            cost_key += f" {ids_hash(ids)}{_batch_key(batch)}"
            seconds, noise = self._call_seconds(cost_key, spec, ids, max_T, batch, timing)
            at_each_T = self._replayed_at_each_T(
                spec, models, ids, transform, greedy, max_T, progress, generation_kwargs, new_tokens
            )
            rates = [DepthRates(r, at) for r, at in zip(rates, at_each_T, strict=True)]
            return LookupCost(seconds, lengths, noise, batch), rates
        cost_key += f"{' compiled' * compile} {ids_hash(ids)}{_batch_key(batch)}"
        timed = [
            self._call_seconds(f"{cost_key} T={T}", spec, ids, T, batch, timing | {"compile": compile})
            for T in tqdm(range(1, max_T + 1), desc="bridged draft calls", disable=not progress)
        ]
        noise = max(n for _, n in timed)
        return BridgedCost(timed[0][0], lengths, noise, batch, tuple(s for s, _ in timed)), rates

    def proposal_rows(
        self,
        spec: ProposalLevel,
        models: Sequence[torch.nn.Module],
        ids: torch.Tensor,
        transform: LogitsTransform,
        greedy: bool,
        max_T: int,
        progress: bool = True,
        generation_kwargs: dict | None = None,
        new_tokens: int | None = None,
    ) -> list[ProposalRows]:
        """How the rows of ``proposal_level``'s pairs differ, for each of ``models``: the calibration
        rows' own profiles, shrunk towards the pooled one (``row_spread.ProposalRows``), from the
        same replay (what a batch's replay needs: its slowest row)."""
        kind, _, replayed_as = _proposal_key(spec, greedy, max_T)
        replayed = self._replayed(
            spec, kind, replayed_as, models, ids, transform, greedy, max_T, progress, generation_kwargs,
            new_tokens, rows=True,
        )  # fmt: skip
        return [
            ProposalRows.shrunk(replayed.calls, replayed.row_lengths, row_rates, replayed.lengths, rates)
            for rates, row_rates in zip(replayed.rates, replayed.row_rates, strict=True)
        ]

    def proposal_through(
        self,
        spec: ProposalLevel,
        models: Sequence[torch.nn.Module],
        ids: torch.Tensor,
        transform: LogitsTransform,
        greedy: bool,
        max_T: int,
        progress: bool = True,
        generation_kwargs: dict | None = None,
        new_tokens: int | None = None,
    ) -> dict[tuple[int, int], RatesThrough | None]:
        """For every two of ``models`` (indices ``(i, j)``), the rates at which ``models[j]`` accepts
        the tokens of ``proposal_level``'s proposals that ``models[i]`` accepted, and greedy the
        corrections i makes of those it rejects, from the same replay
        (``proposal_scores.accepted_through``, ``corrected_through``; None where i accepted none):
        what j verifies in a chain proposal level > i > j (docs/design.md, "Tokens that came
        through"). Asked before ``proposal_level``, one replay serves both."""
        kind, _, replayed_as = _proposal_key(spec, greedy, max_T)
        return self._replayed(
            spec, kind, replayed_as, models, ids, transform, greedy, max_T, progress, generation_kwargs,
            new_tokens, through=True,
        ).through  # fmt: skip

    def _replayed(
        self,
        spec: ProposalLevel,
        kind: str,
        level: str,
        models: Sequence[torch.nn.Module],
        ids: torch.Tensor,
        transform: LogitsTransform,
        greedy: bool,
        max_T: int,
        progress: bool,
        generation_kwargs: dict | None,
        new_tokens: int | None,
        rows: bool = False,
        through: bool = False,
    ) -> Replayed:
        """A proposal level's lengths offered and the rates per position at which each of ``models``
        accepts its proposals (``proposal_replay``), under the keys of its ``kind`` and ``level``;
        with ``rows``, each calibration row's too; with ``through``, for every two of ``models`` the
        rate at which the second accepts the proposed tokens the first accepted
        (``proposal_scores.accepted_through``). A replay stores what it computed; it runs again
        only for what is asked and missing (a cache written before rows were kept serves one row as
        it is), and scores the models whose entries are missing."""
        text = self._text_key(models[-1], ids, transform, greedy, new_tokens)
        names = [model_identity(m) for m in models]
        lengths_key, rate_keys = _replay_keys(kind, level, text, names)
        calls_key, row_lengths_key = f"{kind} row calls {level} {text}", f"{kind} row lengths {level} {text}"
        row_rate_keys = [f"{kind} row rates {level} {name} on {text}" for name in names]
        pairs = [(i, j) for i in range(len(models)) for j in range(len(models)) if i != j] if through else []
        through_keys = {(i, j): f"{kind} through {level} {names[i]} > {names[j]} on {text}" for i, j in pairs}
        get = self.entries.get
        # [model]: whether its forwards are needed (its rates missing, its rows' where asked for, or a
        # pair's through rate it is in)
        unknown = [
            pair for pair, key in through_keys.items() if key not in self.entries or not _through(get(key))
        ]
        in_unknown = {k for pair in unknown for k in pair}
        score = [
            not _rates(get(key)) or (rows and not _row_rates(get(row_key))) or k in in_unknown
            for k, (key, row_key) in enumerate(zip(rate_keys, row_rate_keys, strict=True))
        ]
        rows_missing = rows and not (_numbers(get(calls_key)) and _row_rates(get(row_lengths_key)))
        if any(score) or rows_missing or not _rates(get(lengths_key)):
            text_ids, proposals = self._replay(
                spec, models, ids, text, transform, greedy, max_T, generation_kwargs, new_tokens
            )
            vocab = models[-1].get_output_embeddings().weight.shape[0]
            self.entries[lengths_key] = list(proposal_replay.offered_lengths(proposals, max_T))
            calls, lengths = proposal_replay.row_lengths(proposals, max_T)
            self.entries[calls_key], self.entries[row_lengths_key] = calls, [list(row) for row in lengths]
            items = proposal_scores.scorable(proposals, text_ids)
            probabilities, choices = {}, {}  # model index -> [I] each scorable token's p(x), argmax (greedy)
            scored = [k for k, s in enumerate(score) if s]
            for k in tqdm(scored, desc=f"{kind} replay", disable=not progress):
                scores = teacher_forced_scores(models[k], text_ids, transform, greedy, vocab)
                probabilities[k] = proposal_scores.probabilities(items, scores)
                choices[k] = proposal_scores.choices(items, scores)
                rates = proposal_scores.rates_by_position(
                    items, proposal_scores.accepted(items, probabilities[k]), max_T
                )
                own = proposal_replay.row_rates(proposals, text_ids, scores, max_T)
                self.entries[rate_keys[k]] = list(rates)
                self.entries[row_rate_keys[k]] = [list(row) for row in own]
            for i, j in unknown:
                below, above = probabilities[i], probabilities[j]
                passed = proposal_scores.accepted_through(items, below, above)
                corrected = None
                if choices[i] is not None and choices[j] is not None:
                    corrected = proposal_scores.corrected_through(items, below, choices[i], choices[j])
                self.entries[through_keys[(i, j)]] = None if passed is None else [passed, corrected]
            self.changed = True
        return Replayed(
            tuple(get(lengths_key)),
            [tuple(get(key)) for key in rate_keys],
            tuple(get(calls_key)) if rows else None,
            tuple(map(tuple, get(row_lengths_key))) if rows else None,
            [tuple(map(tuple, get(key))) for key in row_rate_keys] if rows else None,
            {pair: _rates_through(get(key)) for pair, key in through_keys.items()},
        )

    def _replayed_at_each_T(
        self,
        spec: ProposalLevel,
        models: Sequence[torch.nn.Module],
        ids: torch.Tensor,
        transform: LogitsTransform,
        greedy: bool,
        max_T: int,
        progress: bool,
        generation_kwargs: dict | None,
        new_tokens: int | None,
    ) -> list[dict[int, tuple[tuple[float, ...], tuple[float, ...]]]]:
        """A proposal level replayed at every block size T < ``max_T``, its calls where a run at
        that T makes them: for each of ``models``, T -> (lengths offered, its rates per position),
        a ``latency.DepthRates``'s ``at``. Each T's entries sit under the keys a replay at
        ``max_T`` = T writes (``_replayed``); a model's teacher-forced scores serve every T."""
        text = self._text_key(models[-1], ids, transform, greedy, new_tokens)
        names = [model_identity(m) for m in models]
        # T -> (lengths key, [model] rates key)
        keys = {T: _replay_keys(*_proposal_key(spec, greedy, T)[::2], text, names) for T in range(1, max_T)}
        get = self.entries.get
        missing = {
            T: [k for k, key in enumerate(rate_keys) if not _rates(get(key))]
            for T, (_, rate_keys) in keys.items()
        }
        missing = {T: scored for T, scored in missing.items() if scored or not _rates(get(keys[T][0]))}
        if missing:
            vocab = models[-1].get_output_embeddings().weight.shape[0]
            proposals = {}  # T -> its replay's calls
            for T in missing:
                text_ids, proposals[T] = self._replay(
                    spec, models, ids, text, transform, greedy, T, generation_kwargs, new_tokens
                )
                self.entries[keys[T][0]] = list(proposal_replay.offered_lengths(proposals[T], T))
            scored = sorted({k for ks in missing.values() for k in ks})
            for k in tqdm(scored, desc="lookup replay at each T", disable=not progress):
                scores = teacher_forced_scores(models[k], text_ids, transform, greedy, vocab)
                for T in [T for T, ks in missing.items() if k in ks]:
                    rates = proposal_scores.acceptance_by_position(proposals[T], text_ids, scores, T)
                    self.entries[keys[T][1][k]] = list(rates)
            self.changed = True
        return [
            {
                T: (tuple(get(lengths_key)), tuple(get(rate_keys[k])))
                for T, (lengths_key, rate_keys) in keys.items()
            }
            for k in range(len(models))
        ]

    def _replay(
        self,
        spec: ProposalLevel,
        models: Sequence[torch.nn.Module],
        ids: torch.Tensor,
        text: str,
        transform: LogitsTransform,
        greedy: bool,
        max_T: int,
        generation_kwargs: dict | None,
        new_tokens: int | None,
    ) -> tuple[torch.Tensor, list[proposal_scores.Proposal]]:
        """The text a replay walks (the target's own continuation of ``ids``, ``_run_text``) and the
        level's calls on it at block size ``max_T`` (``proposal_scores.replay``)."""
        text_ids = self._run_text(models[-1], ids, text, generation_kwargs, new_tokens)
        sampled = None if greedy else transform  # a level that draws replays its draws
        start = run_text.continuation_start(ids)
        return text_ids, proposal_scores.replay(spec, text_ids, max_T, start=start, transform=sampled)

    def _call_seconds(
        self, key: str, spec: ProposalLevel, ids: torch.Tensor, max_T: int, batch: int, timing: dict
    ) -> tuple[float, float]:
        """(seconds, noise) of a proposal level's call (``proposal_replay.host_seconds``), cached
        under ``key`` and this machine's timing environment."""
        key += f" [{timing_environment(ids.device)}]"
        cost = self.entries.get(key)
        if not (isinstance(cost, dict) and _numbers([cost.get("seconds"), cost.get("noise")])):
            seconds, noise = proposal_replay.host_seconds(spec, ids, max_T, batch=batch, **timing)
            self.entries[key] = cost = {"seconds": seconds, "noise": noise}
            self.changed = True
        return cost["seconds"], cost["noise"]

    @staticmethod
    def _text_key(
        target: torch.nn.Module,
        ids: torch.Tensor,
        transform: LogitsTransform,
        greedy: bool,
        new_tokens: int | None,
    ) -> str:
        """What the text a run meets is made of: the target, the sampling, the calibration ids and,
        where it is not the default half row, the continuation's length (so the keys written
        before runs had a length still name the same text)."""
        key = f"{model_identity(target)} {sampling_key(transform, greedy)} {ids_hash(ids)}"
        if new_tokens is not None and new_tokens != run_text.default_new_tokens(ids):
            key += f" +{new_tokens}"
        return key

    def _run_text(
        self,
        target: torch.nn.Module,
        ids: torch.Tensor,
        key: str,
        generation_kwargs: dict | None,
        new_tokens: int | None,
    ) -> torch.Tensor:
        """[N, L // 2 + new_tokens] ``run_text.continued(target, ids, new_tokens)``, generated once
        per cache and ``key``."""
        if key not in self._texts:
            self._texts[key] = run_text.continued(target, ids, new_tokens, **(generation_kwargs or {}))
        return self._texts[key]


def _batch_key(batch: int) -> str:
    """A cost key's batch: none for one row (the keys measured before batches had one)."""
    return f" batch {batch}" if batch != 1 else ""


def _numbers(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_number(v) for v in value)


def _rates(value: object) -> bool:
    """A non-empty list of probabilities (a lookup level's rates per position or lengths offered)."""
    return _numbers(value) and all(v <= 1 for v in value)


def _row_rates(value: object) -> bool:
    """A non-empty list of ``_rates`` lists, one per calibration row."""
    return isinstance(value, list) and bool(value) and all(_rates(row) for row in value)


class Replayed(NamedTuple):
    """A proposal level's replay (``ProfileCache._replayed``): pooled, and per row where asked."""

    lengths: tuple[float, ...]
    rates: list[Acceptance]  # one per model
    calls: tuple[int, ...] | None  # [N] each row's calls
    row_lengths: tuple[tuple[float, ...], ...] | None  # [N][max_T + 1]
    row_rates: list[tuple[tuple[float, ...], ...]] | None  # one per model: [N][max_T]
    # (i, j) -> model j's rates on what model i passed of the proposals and on its corrections (None:
    # i accepted none)
    through: dict[tuple[int, int], RatesThrough | None]


def _through(value: object) -> bool:
    """A through entry: None (nothing passed), or ``[passed, corrected]`` (corrected: a rate or
    None)."""
    if value is None:
        return True
    return (
        isinstance(value, list)
        and len(value) == 2
        and _is_rate(value[0])
        and (value[1] is None or _is_rate(value[1]))
    )


def _rates_through(entry: object) -> RatesThrough | None:
    """A through entry as stored (``[passed, corrected]``, or None where nothing passed)."""
    return None if entry is None else RatesThrough(*entry)  # type: ignore[misc]


def _replay_keys(kind: str, level: str, text: str, names: Sequence[str]) -> tuple[str, list[str]]:
    """The keys of a replay's lengths offered and of each model's (of ``names``) rates per position."""
    return f"{kind} lengths {level} {text}", [f"{kind} rates {level} {name} on {text}" for name in names]


def _proposal_key(spec: ProposalLevel, greedy: bool, max_T: int) -> tuple[str, str, str]:
    """(kind, level, replayed as): how a proposal level is named in its cost keys and in its
    replay's (which also say whether it hands its q up)."""
    if isinstance(spec, LookupDraft):
        kind, level = "lookup", f"{_lookup_settings(spec)} T{max_T}"
    else:
        draft = f"{model_identity(spec.model)} {tokenizer_identity(spec.tokenizer)}"
        below = zip(spec.below, spec.block_sizes, strict=True)
        draft += "".join(f" over {_level_key(m)} T{t}" for m, t in below)
        kind, level = "bridged", f"{draft} to {tokenizer_identity(spec.target_tokenizer)} T{max_T}"
    shared = " shared" if spec.draws_q(greedy) else ""  # drawn from a shared vocabulary: q handed up
    return kind, level, level + shared


def _warn(message: str) -> None:
    warnings.warn(message, ProfileCacheWarning, stacklevel=3)


def _aside(path: Path) -> Path:
    """``<name>.corrupt-<timestamp>`` next to ``path``, not taken yet."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside, n = path.with_name(f"{path.name}.corrupt-{stamp}"), 1
    while aside.exists():
        aside, n = path.with_name(f"{path.name}.corrupt-{stamp}-{n}"), n + 1
    return aside


def _level_key(level: torch.nn.Module | LookupDraft) -> str:
    """A model's identity, or the lookup level's settings, in a profile key."""
    if isinstance(level, LookupDraft):
        return f"lookup {_lookup_settings(level)}"
    return model_identity(level)


def _lookup_settings(level: LookupDraft) -> str:
    """What a lookup level's proposals depend on: its n-gram range and the proposal rule."""
    return f"{level.max_ngram}-{level.min_ngram} {PROPOSAL_RULE}"
