"""The package's dependency graph: layers, bottom up, and no cycles (docs/design.md, "Layers").

``LAYERS`` is the layer map, the one place it is written down: a module may import from its own layer
and the layers below, never from one above, and the graph has no cycle, within a layer either. Every
import counts: at module level, inside a function, under ``TYPE_CHECKING``, and a module named in a
string (``importlib.import_module("hsd_fast.x")``). ``from hsd_fast.x import y`` is an edge to
``hsd_fast.x.y`` where that is a module, else to ``hsd_fast.x``. Only the top-level face,
``hsd_fast/__init__.py`` (lazy re-exports of the public API), is exempt; no other module imports
from it, except the C++ extension ``hsd_fast._C`` (the lowest layer).

``python tests/test_layers.py`` prints the layer table that docs/design.md quotes.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

LAYERS: list[tuple[str, str, tuple[str, ...]]] = [
    # (name, what it is, modules: names under hsd_fast, "x.*" for a subpackage's modules)
    ("kernels", "the C++ ledger and lookup index, the Triton kernels and their torch references",
     ("_C", "triton_kernels", "triton_kernels.*")),
    ("base", "data types and pure functions every layer shares",
     ("attached", "layout", "stats", "report", "processors", "processor_ops", "sampling_metadata",
      "proposal_level", "lookup", "tree", "schedule", "positions", "hierarchy_types", "switching_types",
      "cli_args", "files")),
    ("model", "the latency model: pure Python and the C++ ledger, never the engine",
     ("latency", "row_spread", "tree_latency", "selector", "batch_latency", "controller", "depth_counts",
      "run_estimates")),
    ("steps", "one level's step: run state, step math, compile policy, buffers, token trees, the target's "
     "kept scores",
     ("steps", "decode_state", "buffer_pool", "compile_policy", "graph_cache", "compile_price", "level_step",
      "tree_plan", "tree_steps", "target_outputs")),
    ("engine", "the HSD loop over the levels, driven by the ledger, and its steps committed to it; switching "
     "hierarchies between rounds; stopping criteria replayed on committed tokens",
     ("engine", "round_steps", "round_log", "stopping", "switching", "probes", "proposal_scores")),
    ("hf", "Hugging Face models as runners; generate's arguments as one request; the drop-in API",
     ("architectures", "compat", "attention", "early_exit", "exit_reuse", "hf_runner", "generation_options",
      "bridge", "other_tokenizer", "other_tokenizer_chain", "other_tokenizer_steps", "request", "hf_generate",
      "wrapper")),
    ("selection", "profiling the levels and choosing a hierarchy", ("profile", "profile.*", "hierarchy")),
    ("zoo", "loading the committed model zoo",
     ("zoo", "zoo.models", "zoo.tokenizer", "zoo.twin", "zoo.calibration", "zoo_data")),
    ("zoo_build", "building the zoo: corpus, training, card",
     ("zoo.corpus", "zoo.train", "zoo.build", "zoo.card", "zoo.tokenizer_training")),
    ("apps", "the command line, benchmarks, demos and test helpers",
     ("cli", "select_command", "select_levels", "bench", "bench.*", "demo", "zoo_demo", "doctor",
      "zoo.commands", "testing", "testing.*")),
]  # fmt: skip

FACE = "hsd_fast"  # the public face: exempt, and imported by nothing inside the package


def package_modules() -> dict[str, Path]:
    """Every module of the installed package by its dotted name (``triton_kernels/`` installs as
    ``hsd_fast.triton_kernels``, ``zoo/`` as ``hsd_fast.zoo_data``)."""
    modules = {"hsd_fast._C": ROOT / "csrc"}
    for folder, package in (("hsd_fast", "hsd_fast"), ("triton_kernels", "hsd_fast.triton_kernels")):
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    modules["hsd_fast.zoo_data"] = ROOT / "zoo" / "__init__.py"
    return modules


def imports_of(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``source`` (the text of ``module``) imports, anywhere in it."""
    here = module if is_package else module.rpartition(".")[0]

    def owner(name: str) -> str | None:  # the longest known module that ``name`` is or lies in
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found: set[str | None] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(owner(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if full in known else owner(target))
        elif isinstance(node, ast.Constant) and re.fullmatch(r"hsd_fast(\.\w+)+", str(node.value)):
            found.add(owner(node.value))
    found.discard(None)
    found.discard(module)
    return found  # type: ignore[return-value]


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    known = set(modules)
    return {
        name: imports_of(path.read_text(), name, path.name == "__init__.py", known)
        for name, path in modules.items()
        if path.suffix == ".py"
    } | {"hsd_fast._C": set()}


def layer_of(module: str) -> int | None:
    short = module.removeprefix("hsd_fast.")
    for index, (_, _, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(short, p) for p in patterns):
            return index
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer_table() -> str:
    """The markdown table docs/design.md quotes: each layer with the modules it holds now."""
    modules = sorted(m for m in import_graph() if m != FACE)
    rows = ["| layer | what it holds | modules (under `hsd_fast`) |", "|---|---|---|"]
    for index, (name, what, _) in enumerate(LAYERS):
        names = [m.removeprefix("hsd_fast.") for m in modules if layer_of(m) == index]
        rows.append(f"| {index + 1}. {name} | {what} | {', '.join(f'`{n}`' for n in names)} |")
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------ tests
def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in import_graph() if m != FACE and layer_of(m) is None]
    assert not unplaced, f"add these modules to LAYERS in {Path(__file__).name}: {unplaced}"


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
        for m, deps in import_graph().items()
        if m != FACE and layer_of(m) is not None
        for d in sorted(deps)
        if d != FACE and layer_of(d) is not None and layer_of(d) > layer_of(m)
    ]
    assert not upward, "\n".join(upward)


def test_nothing_inside_imports_the_public_face() -> None:
    importers = sorted(m for m, deps in import_graph().items() if FACE in deps)
    assert not importers, f"import from the defining module, not from `hsd_fast`: {importers}"


def test_the_graph_has_no_cycle() -> None:
    graph = {m: deps - {FACE} for m, deps in import_graph().items() if m != FACE}
    assert not cycles(graph), cycles(graph)


def test_design_doc_quotes_the_layer_table() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    assert layer_table() in design, (
        "docs/design.md's layer table differs from the code's: paste the output of "
        "`python tests/test_layers.py` under its layer-table marker"
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import hsd_fast.engine", {"hsd_fast.engine"}),
        ("def f():\n    from hsd_fast.engine import run_hsd", {"hsd_fast.engine"}),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hsd_fast import tree",
            {"hsd_fast.tree"},
        ),
        ("import importlib\nimportlib.import_module('hsd_fast.engine')", {"hsd_fast.engine"}),
        ("from hsd_fast import generate", {"hsd_fast"}),
        ("from .tree import Tree", {"hsd_fast.tree"}),
        ("from ..engine import run_hsd", {"hsd_fast.engine"}),
        ("x = 'hsd_fast.zoo/s'  # a model's name, not a module", set()),
    ],
)
def test_every_kind_of_import_is_an_edge(source: str, expected: set[str]) -> None:
    known = {"hsd_fast", "hsd_fast.engine", "hsd_fast.tree", "hsd_fast.profile", "hsd_fast.profile.costs"}
    module = "hsd_fast.profile.costs" if source.startswith("from ..") else "hsd_fast.x"
    assert imports_of(source, module, False, known) == expected


def test_a_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


if __name__ == "__main__":
    sys.stdout.write(layer_table() + "\n")
