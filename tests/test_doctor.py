"""`hsd-fast doctor`: versions, which ops run, and for given checkpoints whether each is admitted
(and why not), vocabulary, dtype and device; whether they form one hierarchy; the refused families."""

from __future__ import annotations

import json

import pytest
import torch
from arch_configs import VOCAB, tiny_model
from printed import words
from transformers import MambaConfig, MambaForCausalLM

from hsd_fast import compile_price
from hsd_fast.architectures import families
from hsd_fast.cli import main

pytestmark = pytest.mark.hf


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    """A sliding-window target (admitted), a draft of its vocabulary (admitted) and a Mamba draft of
    another vocabulary (refused), saved as checkpoint directories."""
    root = tmp_path_factory.mktemp("checkpoints")
    models = {
        "mistral": tiny_model("mistral"),
        "llama": tiny_model("llama"),
        "mamba": MambaForCausalLM(
            MambaConfig(vocab_size=96, hidden_size=16, num_hidden_layers=1, state_size=4)
        ),
    }
    for name, model in models.items():
        model.save_pretrained(root / name)
    return {name: str(root / name) for name in models}


def test_doctor_on_admitted_models(checkpoints, capsys) -> None:
    code = main(
        ["doctor", "--target", checkpoints["mistral"], "--drafts", checkpoints["llama"], "--no-families"]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    for part in ("python ", "torch ", "triton ", "transformers ", "CUDA ", "ops "):
        assert any(line.startswith(part) for line in out.splitlines()), part
    expected_ops = "Triton kernels" if torch.cuda.is_available() else "torch references"
    assert expected_ops in out
    said = words(out)
    assert f"target {checkpoints['mistral']} (MistralForCausalLM, mistral) admitted" in said
    assert f"vocab {VOCAB}, float32, cpu" in said
    assert f"hierarchy one vocabulary ({VOCAB} tokens) and one device" in said
    layers = tiny_model("mistral").config.num_hidden_layers
    assert f"early exit EarlyExit(target, k) for k in 1..{layers - 1} (layers at model.layers)" in said
    assert "the target verifies from its hidden states (layers < k not recomputed)" in said
    assert "registers" not in out  # --no-families
    assert "generation its generation_config (HF's defaults): greedy; no logits processor" in said


def test_doctor_says_where_compiled_steps_are_kept(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    (tmp_path / "fxgraph").mkdir()
    (tmp_path / "fxgraph" / "entry").write_bytes(bytes(3 * 2**20))
    (tmp_path / compile_price.RECORD_FILE).write_text(json.dumps({"a": 17.0, "b": 70.0}))
    assert main(["doctor", "--no-families"]) == 0
    said = words(capsys.readouterr().out)
    assert f"compiled CPU steps kept for later processes in {tmp_path} (3 MiB," in said
    assert "compile price recorded for 2 hierarchies" in said
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "fxgraph" / "entry" / "x"))  # under a file
    assert main(["doctor", "--no-families"]) == 0
    assert "inductor's cache directory unusable" in words(capsys.readouterr().out)
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    assert main(["doctor", "--no-families"]) == 0
    assert "steps compile in every process (TORCHINDUCTOR_FX_GRAPH_CACHE=0)" in words(capsys.readouterr().out)


def test_doctor_says_how_a_checkpoints_generation_config_is_served(tmp_path, capsys) -> None:
    """A checkpoint that samples like Qwen2.5-Instruct (temperature, top-p, top-k, repetition penalty)
    runs compiled, and so does a bad-words ban; top-h runs per position; beam search is refused."""
    model = tiny_model("llama")
    config = model.generation_config
    config.do_sample, config.temperature, config.top_p, config.top_k = True, 0.7, 0.8, 20
    config.repetition_penalty = 1.05
    for extra, expected, code in [
        (
            {},
            "sampled; compiled: RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper",
            0,
        ),
        (
            {"bad_words_ids": [[5]]},
            "compiled: RepetitionPenaltyLogitsProcessor, NoBadWordsLogitsProcessor",
            0,
        ),
        ({"top_h": 0.5}, "per position, eager (such a run is not compiled): TopHLogitsWarper", 0),
        ({"num_beams": 4}, "refused: hsd_fast does not support num_beams=4", 1),
    ]:
        before = {key: getattr(config, key) for key in extra}
        for key, value in extra.items():
            setattr(config, key, value)
        model.save_pretrained(tmp_path / "ckpt")
        got = main(["doctor", "--target", str(tmp_path / "ckpt"), "--no-families"])
        said = words(capsys.readouterr().out)
        assert got == code and expected in said, said
        assert "repetition_penalty=1.05, temperature=0.7" in said and "top_k=20, top_p=0.8" in said
        for key, value in before.items():
            setattr(config, key, value)


def test_doctor_names_what_is_refused_and_lists_the_refused_families(checkpoints, capsys) -> None:
    code = main(["doctor", "--target", checkpoints["mistral"], "--drafts", checkpoints["mamba"]])
    out = capsys.readouterr().out
    assert code == 1
    said = words(out)
    assert "refused: draft 0 (MambaForCausalLM): architecture not supported: layers with state" in said
    assert "vocab 96, float32, cpu" in said
    assert "hierarchy refused: target and drafts have different vocabularies" in said
    refused = [f for f in families() if not f.admitted]
    assert f"{len(refused)} refused:" in said
    for family in refused:
        assert f"{family.model_type} ({family.class_name}): {family.reason}" in said
