"""Tools to check that HSD is exact, for the tests and for ``hsd-fast demo --tables``.

- ``tables``: table models (explicit next-token distributions over a tiny vocabulary) and their
  runner, whose exact continuation distributions can be enumerated;
- ``exactness``: a pooled chi-square test, and ``table_check``, which samples HSD over table models
  and tests the samples against the target's exact distribution.
"""
