"""Test configuration. The Triton interpreter must be chosen before any kernel module is imported
(docs/design.md, "The Triton interpreter": the mode is fixed when `@triton.jit` runs), so it is set
here, first."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy
import pytest
import triton
from hypothesis import settings
from packaging.version import Version

settings.register_profile("ci", max_examples=200, deadline=None, derandomize=True, print_blob=True)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_configure(config: pytest.Config) -> None:
    # Triton 3.6's interpreter turns a loop bound into int(1-element array), which numpy >= 2.4
    # refuses: every kernel with a runtime-bounded loop would fail. Triton 3.7 fixed it (.squeeze()).
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    triton_version, numpy_version = Version(triton.__version__), Version(numpy.__version__)
    if interpreted and triton_version < Version("3.7") and numpy_version >= Version("2.4"):
        raise pytest.UsageError(
            f"the Triton {triton.__version__} interpreter cannot run loops with numpy {numpy.__version__}: "
            "install numpy<2.4 or triton>=3.7"
        )
