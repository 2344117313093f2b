"""Why HF's prompt lookup verified 4.6-5.0 tokens per target forward on the machine's varied text and our
lookup level 2.2-3.3 (``bench/results/e2e_checkpoints_cpu.md``, before the fix): proposal rules replayed on
the target's own greedy output, no timing.

Greedy verification accepts a proposal's longest prefix equal to the target's tokens, then adds one
token: so tokens per target forward is a function of the proposal rule and the output alone. Rules:

- our first rule (until 2026-12-05): the longest suffix of up to 3 tokens, its latest earlier
  occurrence, and what followed it, **cut at the end of the sequence**: in a loop of period p the
  latest occurrence is p tokens back, so at most p tokens were proposed, whatever T was;
- the overlapping copy (``csrc/lookup_index.cpp: LookupIndex::propose`` now): the same match, the
  continuation read on into the proposal itself (LZ77's overlapping copy: a loop continues), up to T;
- HF's (``PromptLookupCandidateGenerator``, ``max_matching_ngram_size=2``): a 2-gram then a 1-gram
  suffix, its earliest occurrence, 10 tokens;
- a lookup *tree* (not built; docs/design.md §10.4, *A tree of lookups*): the continuations of the
  most recent earlier occurrences of the longest suffixes (3 tokens down to 1), each read on into
  itself as the overlapping copy does, distinct, added while the trie they make holds at most N
  tokens; verified in one forward, its longest path equal to the target's tokens is accepted. Its
  first path is the overlapping copy's proposal (checked at every call). Also reported: the tokens
  a tree's forward verifies (its nodes and the one before them), what a chain of T verifies at most.

    python bench/bench_lookup_replay.py     # zoo s, 3 prompts of 64 tokens per text set, 128 new tokens

Writes bench/results/lookup_replay_cpu.{json,md}.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from kernel_bench import run_meta, write_results

from hsd_fast import zoo
from hsd_fast._C import LookupIndex
from hsd_fast.bench.text_sets import available, prompt_set

NEW_TOKENS = 128
PROMPTS = 3


def first_rule(seq: list[int], T: int, max_ngram: int = 3) -> list[int]:
    """Our lookup level's first rule (no longer in the product): the same match as now, its
    continuation cut at the end of ``seq``."""
    last = len(seq) - 1
    for n in range(max_ngram, 0, -1):
        for end in range(last - 1, n - 2, -1):  # the latest earlier occurrence
            if seq[end - n + 1 : end + 1] == seq[-n:]:
                return seq[end + 1 : end + 1 + T]
    return []


def overlapping_copy(seq: list[int], T: int) -> list[int]:
    """Our lookup level's proposal now: the product's own index (default n-grams, 3 down to 1)."""
    index = LookupIndex(3, 1)
    index.extend(seq)
    return index.propose(T).tolist()


def hf(seq: list[int], num_tokens: int = 10, max_ngram: int = 2) -> list[int]:
    """HF's prompt-lookup candidates for ``seq``."""
    for n in range(max_ngram, 0, -1):
        for start in range(len(seq) - n):  # the earliest occurrence
            if seq[start : start + n] == seq[-n:]:
                return seq[start + n : start + n + num_tokens]
    return []


def lookup_tree(seq: list[int], T: int, nodes: int, max_ngram: int = 3) -> list[list[int]]:
    """The paths of a lookup tree of at most ``nodes`` tokens over ``seq`` (module doc), the lookup
    level's own proposal first."""
    paths: list[list[int]] = []
    trie: set[tuple[int, ...]] = set()  # the tree's nodes, as the paths to them
    for n in range(max_ngram, 0, -1):
        for end in range(len(seq) - 2, n - 2, -1):  # each earlier occurrence, the latest first
            if seq[end - n + 1 : end + 1] != seq[-n:]:
                continue
            path: list[int] = []
            for k in range(end + 1, end + 1 + T):  # read on into the proposal itself, as the index does
                path.append(seq[k] if k < len(seq) else path[k - len(seq)])
            new = {tuple(path[: i + 1]) for i in range(T)} - trie
            if not new:
                continue
            if len(trie) + len(new) > nodes:
                return paths
            trie |= new
            paths.append(path)
    return paths


def tokens_per_forward(
    full: list[int], prompt_len: int, propose: Callable[[list[int]], list[list[int]]]
) -> tuple[float, float]:
    """Greedy tokens per target forward of ``propose`` over ``full`` (prompt, then the target's
    output), and the tokens a forward verifies: a proposal's, and the one before it. ``propose``
    returns the paths of what it proposes (one for a chain; the longest prefix equal to the output
    is accepted)."""
    at, forwards, verified = prompt_len, 0, 0
    while at < len(full):
        paths = propose(full[:at])
        best = max((_taken(path, full, at) for path in paths), default=0)
        verified += len({tuple(path[: i + 1]) for path in paths for i in range(len(path))}) + 1
        at += best + 1
        forwards += 1
    return (len(full) - prompt_len) / forwards, verified / forwards


def _taken(proposal: list[int], full: list[int], at: int) -> int:
    """How many leading tokens of ``proposal`` equal ``full``'s from ``at`` on."""
    taken = 0
    while taken < len(proposal) and at + taken < len(full) and proposal[taken] == full[at + taken]:
        taken += 1
    return taken


def checked_tree(seq: list[int], T: int, nodes: int) -> list[list[int]]:
    """``lookup_tree``, its first path checked against the product's own proposal."""
    paths = lookup_tree(seq, T, nodes)
    assert (paths[0] if paths else []) == overlapping_copy(seq, T), "the tree's first path is the lookup's"
    return paths


RULES = {  # each returns the paths it proposes: one for a chain, a tree's several
    "first rule (cut at the end), T=6": lambda seq: [first_rule(seq, 6)],
    "first rule (cut at the end), T=10": lambda seq: [first_rule(seq, 10)],
    "overlapping copy (now), T=6": lambda seq: [overlapping_copy(seq, 6)],
    "overlapping copy (now), T=10": lambda seq: [overlapping_copy(seq, 10)],
    "HF prompt lookup (10 tokens)": lambda seq: [hf(seq)],
    "overlapping copy, T=8": lambda seq: [overlapping_copy(seq, 8)],
    "tree of 16, T=8": lambda seq: checked_tree(seq, 8, 16),
    "overlapping copy, T=12": lambda seq: [overlapping_copy(seq, 12)],
    "tree of 32, T=12": lambda seq: checked_tree(seq, 12, 32),
    "overlapping copy, T=16": lambda seq: [overlapping_copy(seq, 16)],
    "tree of 32, T=16": lambda seq: checked_tree(seq, 16, 32),
}


def main() -> None:
    tokenizer, target = zoo.load_tokenizer(), zoo.load("s")
    rows = []
    for name in available():
        prompts = prompt_set(name, lambda text: tokenizer(text)["input_ids"], 4, PROMPTS, 128, 64).prompts
        outputs = []
        for prompt in prompts:
            ids = prompt[None]
            with torch.no_grad():
                out = target.generate(
                    ids, do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=None, pad_token_id=0
                )
            outputs.append(out[0].tolist())
        row = {"text set": name}
        for rule, propose in RULES.items():
            measured = [tokens_per_forward(full, prompts.shape[1], propose) for full in outputs]
            rates, widths = zip(*measured, strict=True)
            row[rule] = round(sum(rates) / len(rates), 2)
            if rule.startswith("tree"):
                row[f"{rule}: tokens verified"] = round(sum(widths) / len(widths), 1)
        rows.append(row)
        print(row, flush=True)
    notes = [
        f"Zoo `s`, greedy, {PROMPTS} prompts of 64 tokens per text set (`hsd_fast.bench.text_sets`, the "
        f"prompts `hsd-fast bench --prompts-per-set {PROMPTS}` measures), {NEW_TOKENS} new tokens; tokens "
        "per target forward (the mean over prompts) of each proposal rule replayed on the target's own "
        "greedy output. No timing: the module docstring defines the rules. A tree's tokens verified: "
        "per forward, its nodes and the token before them (a chain of T verifies at most T + 1).",
    ]
    meta = run_meta("cpu", model="zoo s", new_tokens=NEW_TOKENS, prompts_per_set=PROMPTS)
    write_results("lookup_replay_cpu", "Lookup proposal rules replayed", notes, ["text set"], rows, meta)


if __name__ == "__main__":
    main()
