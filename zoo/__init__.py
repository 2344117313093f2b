"""Data package: the committed model zoo (tokenizer, int8 weights, manifest). Code: ``hsd_fast.zoo``."""
