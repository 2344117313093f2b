"""Test configuration. The Triton interpreter must be chosen before any kernel module is imported
(docs/design.md, "The Triton interpreter": the mode is fixed when `@triton.jit` runs), so it is set
here, first. Triton itself is imported only to check its version: where it is not installed
(macOS, Windows) the tests marked ``triton`` skip and the rest run."""

import functools
import gc
import os
from collections.abc import Iterator

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if "PYTEST_XDIST_WORKER" in os.environ:  # one worker per core (`-n auto`): no thread contends for it
    torch.set_num_threads(1)

import numpy
import pytest
from hypothesis import settings
from packaging.version import Version

settings.register_profile("ci", max_examples=200, deadline=None, derandomize=True, print_blob=True)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@functools.cache
def triton_version() -> Version | None:
    """The installed Triton's version; None where it cannot be imported."""
    try:
        import triton
    except ImportError:
        return None
    return Version(triton.__version__)


def pytest_configure(config: pytest.Config) -> None:
    # Triton 3.6's interpreter turns a loop bound into int(1-element array), which numpy >= 2.4
    # refuses: every kernel with a runtime-bounded loop would fail. Triton 3.7 fixed it (.squeeze()).
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    version, numpy_version = triton_version(), Version(numpy.__version__)
    if interpreted and version is not None and version < Version("3.7") and numpy_version >= Version("2.4"):
        raise pytest.UsageError(
            f"the Triton {version} interpreter cannot run loops with numpy {numpy.__version__}: "
            "install numpy<2.4 or triton>=3.7"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without Triton the kernel tests (marked ``triton``) skip: the references and the engine's
    CPU path need no Triton (docs/design.md, "The house rule for ops")."""
    if triton_version() is not None:
        return
    skip = pytest.mark.skip(reason="Triton is not installed (the `triton` tests run its kernels)")
    for item in items:
        if item.get_closest_marker("triton"):
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="module")
def forget_models_after_each_module() -> Iterator[None]:
    """After each test module its models go (their runners and steps live on them and go along:
    ``tests/test_caches.py``); dynamo's caches are reset so that the next module compiles from a
    clean slate rather than beside the graphs of models it never sees."""
    yield
    torch._dynamo.reset()
    gc.collect()


@pytest.fixture(autouse=True)
def memory_for_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a compiled run builds a CPU graph depends on the memory available at that moment
    (``compile_policy.graph_memory_ok``); beside other test workers it can dip under the reserve and
    a test of compiled steps would silently run eagerly. Tests see unknown memory (every graph
    allowed); the test of the cap sets its own."""
    from hsd_fast import compile_policy

    monkeypatch.setattr(compile_policy, "available_memory", lambda: None)


@pytest.fixture
def compile_decisions(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each level step a run builds was asked to compile (``compile="auto"``'s decision),
    appended as runs build them; the steps are built eager, so nothing compiles."""
    from hsd_fast.level_step import LevelStep

    asked: list[bool] = []
    build = LevelStep.of

    def eager_step(runner, level, top, compile, *args):
        asked.append(compile)
        return build(runner, level, top, False, *args)

    monkeypatch.setattr(LevelStep, "of", staticmethod(eager_step))
    return asked


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    """A tiny random Llama (``hf_models.tiny_model``): the target of the HF-facing tests that need
    no other (a test module defines its own ``target`` to use another)."""
    from hf_models import tiny_model  # transformers only where a test asks for it

    return tiny_model("llama")


@pytest.fixture(scope="module")
def drafts(target) -> list[torch.nn.Module]:
    """Two drafts derived from ``target``, smallest first (``hf_models.derived_drafts``)."""
    from hf_models import derived_drafts

    return derived_drafts(target, 2)
