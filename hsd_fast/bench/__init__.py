"""``hsd-fast bench``: every way to generate, side by side in one process, interleaved.

- ``scenarios``: the models and prompt sets (the zoo; the zoo with cost twins; a tiny random family
  for smoke tests);
- ``configs``: the configurations: HF ``generate`` eager and compiled, HF assisted generation and
  prompt lookup, our own engine with no draft, one draft, the selector's pick and a grid's best;
- ``timing``: interleaved passes after warm-up, with a check that no other process took the CPU;
- ``measuring``: prompts as batches, the configurations timed on them, a result row each;
- ``results``: the JSON, markdown and plot files under ``bench/results/`` (and the bench scripts'
  driver);
- ``command``: ``hsd-fast bench`` itself: choosing the hierarchies, then all of the above.
"""
