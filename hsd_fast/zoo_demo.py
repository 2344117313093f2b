"""`hsd-fast demo`: greedy HSD over the committed zoo next to the target's own greedy decoding.

The hierarchy comes from ``select_hierarchy`` over the lookup level and the smaller zoo models, with
the zoo's committed CPU profile (no re-profiling when the models match it); with ``adapt`` it is the
first round's, and the latency controller changes it as the request decodes. The two outputs must be
identical token for token. HSD runs compiled by default: a first call compiles its steps (reported
apart), and the timed call runs them; HF's ``generate`` is timed as users call it (eager).
"""

from __future__ import annotations

import time

import torch

from hsd_fast import zoo
from hsd_fast.hf_generate import generate as hsd_generate
from hsd_fast.hierarchy import select_hierarchy
from hsd_fast.positions import COMMAND_FORM, check_positions, fewest_positions, read_config
from hsd_fast.profile import ProfileCache
from hsd_fast.zoo.calibration import read_calibration

PROMPT = '''def read_config(path):
    """Read a configuration file and return a dict of its sections."""
'''


def position_limit() -> int | None:
    """The fewest positions any zoo model takes (``max_position_embeddings``, read from the configs
    without loading a model); None if no config states one."""
    return fewest_positions(read_config(zoo.zoo_dir() / name / "config.json") for name in zoo.names())


def check_length(prompt: str, max_new_tokens: int) -> None:
    """``ValueError`` unless the prompt has a token and prompt + ``max_new_tokens`` fit the zoo
    models' positions: beyond them a model either fails mid-run or continues on positions it was
    never trained on (silently wrong text)."""
    tokens = zoo.load_tokenizer()(prompt, return_tensors="pt")["input_ids"].shape[1]
    if tokens == 0:
        raise ValueError("the prompt is empty: it needs at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    limit = position_limit()
    if limit is not None:
        check_positions(
            tokens + max_new_tokens,
            [("zoo models'", limit)],
            asked=f"the prompt ({tokens} tokens) + --max-new-tokens {max_new_tokens}",
            remedy=f"use --max-new-tokens <= {limit - tokens}" if tokens < limit else "shorten the prompt",
            form=COMMAND_FORM,
        )


def main(
    prompt: str = PROMPT,
    max_new_tokens: int = 128,
    threads: int | None = None,
    compile: bool = True,
    adapt: bool = False,
) -> int:
    check_length(prompt, max_new_tokens)  # before loading anything large
    if threads:
        torch.set_num_threads(threads)
    names = zoo.names()
    tokenizer = zoo.load_tokenizer()
    models = [zoo.load(name) for name in names]
    target = models[-1]
    sizes = [f"{n} ({m.num_parameters() / 1e6:.1f} M)" for n, m in zip(names, models, strict=True)]
    print(f"zoo: {', '.join(sizes)}")
    calibration = torch.cat(list(read_calibration(zoo.zoo_dir()).values()))
    cache = ProfileCache(fallbacks=[zoo.zoo_dir() / "profile_cpu.json"])
    candidates = ["lookup", *models[:-1]]  # the lookup level and every smaller zoo model
    pick = select_hierarchy(  # for the run below: its steps (compiled or not), its length
        target, candidates, calibration, context=128, cache=cache, progress=False, compile=compile,
        max_new_tokens=max_new_tokens,
    )  # fmt: skip
    chain = " > ".join(["lookup", *names][i] for i in pick.chain)
    baseline = "our no-draft decoding" + (", compiled" if compile else "")
    print(
        f"hierarchy: {chain}, T = {list(pick.T)} (predicted {pick.speedup_over_ar:.2f}x {baseline}, "
        "on the zoo's calibration text)\n"
    )
    for reason in (pick.no_draft_reason, pick.fewer_drafts_reason):
        if reason:
            print(f"({reason})\n")

    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    kwargs = {"do_sample": False, "max_new_tokens": max_new_tokens, "eos_token_id": None}
    target.generate(ids, **{**kwargs, "max_new_tokens": 4})  # warm-up
    start = time.perf_counter()
    expected = target.generate(ids, **kwargs)
    ar_seconds = time.perf_counter() - start
    hsd_kwargs = {"custom_generate": hsd_generate, "hierarchy": pick, "output_hsd_stats": True}
    hsd_kwargs["compile"] = compile
    if adapt:  # every zoo draft a candidate; the pick's profile steers (docs/design.md §8.9)
        hsd_kwargs.update(adapt=True, drafts=candidates)
    if compile:
        print("compiling HSD's steps (or loading those an earlier run compiled) ...", flush=True)
    start = time.perf_counter()
    out = target.generate(ids, **hsd_kwargs, **kwargs)
    hsd_seconds = time.perf_counter() - start
    compile_seconds = None
    if compile:  # the first call compiled the steps; time a second one
        compile_seconds = hsd_seconds
        start = time.perf_counter()
        out = target.generate(ids, **hsd_kwargs, **kwargs)
        hsd_seconds = time.perf_counter() - start

    print(tokenizer.decode(out.sequences[0]))
    print("-" * 72)
    new = out.sequences.shape[1] - ids.shape[1]
    print(f"target alone (HF generate): {new / ar_seconds:7.1f} tok/s")
    how = ("compiled steps" if compile else "eager") + (", adaptive" if adapt else "")
    print(
        f"HSD over the zoo ({how}): {new / hsd_seconds:7.1f} tok/s  ({ar_seconds / hsd_seconds:.2f}x)"
        + (f"; the first call (compiling) took {compile_seconds:.0f} s" if compile else "")
    )
    stats = out.hsd_stats
    print(f"drafts accepted per target forward: {stats.mean_accepted_per_target_pass:.2f}\n")
    print(stats.summary())
    same = out.sequences.tolist() == expected.tolist()
    print(f"\nHSD output {'equals' if same else 'DIFFERS FROM'} the target's own greedy output.")
    return 0 if same else 1
