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
  suffix, its earliest occurrence, 10 tokens.

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


def tokens_per_forward(full: list[int], prompt_len: int, propose: Callable[[list[int]], list[int]]) -> float:
    """Greedy tokens per target forward of ``propose`` over ``full`` (prompt, then the target's output)."""
    at, forwards = prompt_len, 0
    while at < len(full):
        proposal = propose(full[:at])
        accepted = 0
        while (
            accepted < len(proposal)
            and at + accepted < len(full)
            and proposal[accepted] == full[at + accepted]
        ):
            accepted += 1
        at += accepted + 1
        forwards += 1
    return (len(full) - prompt_len) / forwards


RULES = {
    "first rule (cut at the end), T=6": lambda seq: first_rule(seq, 6),
    "first rule (cut at the end), T=10": lambda seq: first_rule(seq, 10),
    "overlapping copy (now), T=6": lambda seq: overlapping_copy(seq, 6),
    "overlapping copy (now), T=10": lambda seq: overlapping_copy(seq, 10),
    "HF prompt lookup (10 tokens)": hf,
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
            rates = [tokens_per_forward(full, prompts.shape[1], propose) for full in outputs]
            row[rule] = sum(rates) / len(rates)
        rows.append(row)
        print(row, flush=True)
    notes = [
        f"Zoo `s`, greedy, {PROMPTS} prompts of 64 tokens per text set (`hsd_fast.bench.text_sets`, the "
        f"prompts `hsd-fast bench --prompts-per-set {PROMPTS}` measures), {NEW_TOKENS} new tokens; tokens "
        "per target forward (the mean over prompts) of each proposal rule replayed on the target's own "
        "greedy output. No timing: the module docstring defines the rules.",
    ]
    meta = run_meta("cpu", model="zoo s", new_tokens=NEW_TOKENS, prompts_per_set=PROMPTS)
    write_results("lookup_replay_cpu", "Lookup proposal rules replayed", notes, ["text set"], rows, meta)


if __name__ == "__main__":
    main()
