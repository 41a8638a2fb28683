"""The llama.cpp engine (measure/engines/llamacpp.py, gguf_files.py, lossless.py) on the real packaged GGUFs.

Decoder semantics (forward/rollback against recomputation, batched against
one-at-a-time logits), greedy speculative decoding through the Decoder with a
small loop that is this test's oracle (the product loop is
measure.decoding's), the quantisation cache, the vocabulary check, the peer,
bad input, and the near-tie criterion on constructed logits. Every llama.cpp
computation runs in the engine's worker process, llama-cpp-python's own loops
in the reference process: this process (with torch) never loads a llama.cpp
CPU backend (checked). The worker itself, its crash
handling and the check before trusting a build: test_llamacpp_native.py.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from measure.decoding import speculative_generate
from measure.drafts import ModelDraft
from measure.seam import Decoder, Engine, EngineOptions, TargetModel
from sim.policies import FixedGamma
from measure.engines.gguf_files import GGUF_MAGIC, QUANT_TYPES, check_gguf, file_sha256
from tests.support.gguf_headers import gguf_header
from measure.engines.lossless import (NEAR_TIE_TOLERANCE, baseline_logits_at, check_greedy_lossless,
                                      count_statuses, first_divergence)

HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
needs_llama = pytest.mark.skipif(not HAVE_LLAMA, reason="llama-cpp-python is not installed "
                                 "(python -m measure build-llamacpp; `make venv` runs it)")
ROOT = Path(__file__).resolve().parents[3]
MESSAGES = ("Explain the difference between a list and a tuple in Python.",
            "Give me three ideas for a healthy breakfast.")


# -- the near-tie criterion (no model) ----------------------------------------------------------
def _logits(values: dict[int, float], vocab: int = 8) -> torch.Tensor:
    x = torch.full((vocab,), -10.0)
    for i, v in values.items():
        x[i] = v
    return x


def test_identical_outputs_need_no_logits():
    def never(i: int) -> torch.Tensor:
        raise AssertionError("logits asked for identical outputs")

    c = check_greedy_lossless([1, 2, 3], [1, 2, 3], never)
    assert c.status == "identical" and c.ok and c.position is None and c.margin is None


def test_divergence_at_a_near_tie_is_a_near_tie_with_position_and_margin():
    c = check_greedy_lossless([1, 2, 3, 4], [1, 2, 5, 6], lambda i: _logits({3: 4.00, 5: 3.97}), tolerance=0.1)
    assert c.status == "near_tie" and c.ok
    assert c.position == 2 and c.tokens == (3, 5) and c.margin == pytest.approx(0.03, abs=1e-5)


def test_divergence_at_a_wide_margin_is_a_failure():
    c = check_greedy_lossless([1, 2, 3], [1, 7, 3], lambda i: _logits({2: 5.0, 7: 3.0}), tolerance=0.5)
    assert c.status == "failure" and not c.ok and c.position == 1 and c.margin == pytest.approx(2.0)


def test_a_token_outside_the_tied_pair_is_a_failure_even_at_a_small_top_two_margin():
    # tokens 2 and 3 are tied at the top, but the speculative output took token 6 (far below)
    c = check_greedy_lossless([2], [6], lambda i: _logits({2: 5.0, 3: 4.99, 6: 1.0}), tolerance=0.5)
    assert c.status == "failure" and c.margin == pytest.approx(0.01, abs=1e-5)


def test_one_output_a_strict_prefix_of_the_other_is_a_failure():
    c = check_greedy_lossless([1, 2, 3], [1, 2], lambda i: _logits({1: 1.0}))
    assert c.status == "failure" and c.position == 2 and c.margin is None
    assert first_divergence([1, 2], [1, 2]) is None and first_divergence([1], [2]) == 0


def test_count_statuses_and_bad_tolerance():
    checks = [check_greedy_lossless([1], [1], lambda i: _logits({})),
              check_greedy_lossless([1], [2], lambda i: _logits({1: 1.0, 2: 0.99})),
              check_greedy_lossless([1], [2], lambda i: _logits({1: 3.0, 2: 0.0}))]
    assert count_statuses(checks) == {"identical": 1, "near_tie": 1, "failure": 1}
    with pytest.raises(ValueError, match="tolerance"):
        check_greedy_lossless([1], [2], lambda i: _logits({}), tolerance=-1.0)


# -- files and specs (no llama_cpp needed) ----------------------------------------------------------
def test_bad_gguf_paths_are_one_line_errors(tmp_path):
    from measure.engines.llamacpp import check_specs, resolve_model_path

    with pytest.raises(ValueError, match=r"^--target gguf:/no/such\.gguf: no such file$"):
        resolve_model_path("gguf:/no/such.gguf")
    txt = tmp_path / "notes.gguf"
    txt.write_text("hello, not a model")
    with pytest.raises(ValueError, match="not a GGUF file") as e:
        resolve_model_path(f"gguf:{txt}")
    assert "\n" not in str(e.value) and str(txt) in str(e.value)
    with pytest.raises(ValueError, match="unknown model .*valid: gguf:FILE"):
        resolve_model_path("gpt2")
    with pytest.raises(ValueError, match=r"^--draft model:gguf:/no/x\.gguf: no such file$"):
        check_specs("gguf:" + str(_fake_gguf(tmp_path)), ["model:gguf:/no/x.gguf"])


def _fake_gguf(tmp_path: Path) -> Path:
    p = tmp_path / "fake.gguf"
    p.write_bytes(GGUF_MAGIC + b"\x03\x00\x00\x00")
    return p


def test_the_training_context_is_read_from_thegguf_header(tmp_path):
    # issue 32: --max-prompt-tokens beyond the model's context was accepted; the check needs the context
    # before any weights load (gguf's GGUFReader indexes the whole file: 5-28 s for the packaged models)
    import struct

    from measure.engines import context_tokens
    from measure.engines.gguf_files import gguf_context_tokens

    def s(text: str) -> bytes:
        return struct.pack("<Q", len(text)) + text.encode()

    tokens = struct.pack("<IQ", 8, 3) + s("a") + s("bb") + s("<eos>")  # an array of strings, walked
    scores = struct.pack("<IQ", 6, 1000) + bytes(4000)  # an array of floats, skipped whole
    nested = struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 4, 2) + bytes(8)  # an array of u32 arrays
    kvs = [("general.architecture", 8, s("llama")), ("tokenizer.ggml.tokens", 9, tokens),
           ("tokenizer.ggml.scores", 9, scores), ("x.nested", 9, nested), ("other.context_length", 4,
                                                                          struct.pack("<I", 7)),
           ("llama.context_length", 4, struct.pack("<I", 2048))]
    good = tmp_path / "m.gguf"
    good.write_bytes(gguf_header(kvs))
    assert gguf_context_tokens(good) == 2048
    assert context_tokens("llamacpp", f"gguf:{good}") == context_tokens("transformers", f"gguf:{good}") == 2048
    # key order does not matter; the architecture's own key is the one read
    (tmp_path / "late.gguf").write_bytes(gguf_header([kvs[5], kvs[4], kvs[0]]))
    assert gguf_context_tokens(tmp_path / "late.gguf") == 2048
    # unknown, not a failure: the model's loader names what is wrong with the file
    cases = {"v1.gguf": gguf_header(kvs, version=1), "short.gguf": gguf_header(kvs)[:60],
             "none.gguf": gguf_header(kvs[:4]), "zero.gguf": gguf_header([kvs[0], ("llama.context_length", 4,
                                                                                   bytes(4))]),
             "badtype.gguf": gguf_header([kvs[0], ("x", 99, b"")] + kvs[5:]), "text.gguf": b"hello"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        assert gguf_context_tokens(tmp_path / name) is None, name


def test_unknown_quant_type_and_draft_kind_list_the_valid_ones(tmp_path):
    from measure.engines.llamacpp import check_specs

    target = "gguf:" + str(_fake_gguf(tmp_path))
    with pytest.raises(ValueError) as e:
        check_specs(target, ["quant:q9_9"])
    msg = str(e.value)
    assert msg.startswith("--draft quant:q9_9: unknown quantisation type; valid: ") and "\n" not in msg
    assert all(q in msg for q in ("q8_0", "q4_0", "q2_k"))
    with pytest.raises(ValueError, match="not a draft of --engine llamacpp; valid: ngram"):
        check_specs(target, ["early:4"])
    with pytest.raises(ValueError, match="ngram"):
        check_specs(target, ["ngram:abc"])
    check_specs(target, ["ngram:3", "quant:Q8_0"])  # valid specs pass (case-insensitive type)


def test_sweep_config_checks_drafts_by_the_engines_own_forms(tmp_path):
    """quant:TYPE is a llama.cpp draft and int8 a transformers one: the sweep's config asks the engine."""
    from measure.sweep import SweepConfig

    target = "gguf:" + str(_fake_gguf(tmp_path))
    SweepConfig(target=target, drafts=("ngram:3:first", "quant:q8_0"), engine="llamacpp")
    with pytest.raises(ValueError, match="not a draft of --engine llamacpp"):
        SweepConfig(target=target, drafts=("int8",), engine="llamacpp")
    with pytest.raises(ValueError, match="unknown draft kind 'quant:q8_0'"):
        SweepConfig(target="smollm2-135m", drafts=("quant:q8_0",), engine="transformers")
    with pytest.raises(ValueError, match="no.gguf"):  # the target file, before any weights load
        SweepConfig(target="gguf:" + str(tmp_path / "no.gguf"), drafts=("ngram:3",), engine="llamacpp")


def test_file_hash_is_cached_by_path_size_and_mtime(tmp_path):
    p = tmp_path / "w.gguf"
    p.write_bytes(GGUF_MAGIC + b"abc")
    root = tmp_path / "cache"
    h1 = file_sha256(p, root)
    assert h1 == hashlib.sha256(GGUF_MAGIC + b"abc").hexdigest()
    assert h1 in (root / "hashes.json").read_text()
    p.write_bytes(GGUF_MAGIC + b"abcd")  # new size → new key → re-hashed
    assert file_sha256(p, root) == hashlib.sha256(GGUF_MAGIC + b"abcd").hexdigest()
    assert check_gguf(p, "--x ") == p.resolve()


def test_missing_llama_cpp_names_the_build_command(monkeypatch):
    from measure.engines import llamacpp

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(ImportError) as e:
        llamacpp.make_engine(EngineOptions())
    assert "python -m measure build-llamacpp" in str(e.value) and "\n" not in str(e.value)


def test_vocabulary_mismatch_compares_size_and_token_texts():
    from measure.engines.llamacpp_native.runtime import vocabulary_mismatch

    def texts(i: int) -> bytes:
        return f"t{i}".encode()

    assert vocabulary_mismatch(1000, 1000, texts, texts) is None
    assert "vocabulary size 999" in vocabulary_mismatch(1000, 999, texts, texts)
    why = vocabulary_mismatch(1000, 1000, texts, lambda i: b"other" if i == 999 else texts(i))
    assert why.startswith("token 999 is b'other'")


def test_llama_cpp_log_lines_pass_by_their_real_level(capsys):
    # issue 43: llama-cpp-python maps an older ggml level order, so INFO (2) passed as a warning: 180 lines of
    # loader metadata before a one-line error without --quiet
    from types import SimpleNamespace

    from measure.engines.llamacpp_native import runtime

    ll = SimpleNamespace(llama_log_callback=lambda f: f)
    for quiet, shown in ((False, "warn\n...more\nerror\n"), (True, "error\n")):
        cb = runtime._log_callback(ll, quiet)
        for level, text in ((1, b"debug\n"), (2, b"info: kv 0\n"), (5, b"info continued\n"), (3, b"warn\n"),
                            (5, b"...more\n"), (4, b"error\n")):
            cb(level, text, None)
        assert capsys.readouterr().err == shown


@needs_llama
def test_a_model_that_fails_to_load_says_why_in_one_line_without_the_loader_dump(tmp_path):
    from measure.engines.gguf_files import PACKAGED

    try:
        good = PACKAGED["smollm2-135m"]()
    except ValueError as e:
        pytest.skip(str(e))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:4_000_000])
    code = ("from pathlib import Path; from measure.engines.llamacpp_native.runtime import Runtime\n"
            f"rt = Runtime(quiet=False)\nrt.load_model(Path({str(good)!r}), 0, vocab_only=True)\n"
            f"try:\n    rt.load_model(Path({str(cut)!r}), 0)\nexcept ValueError as e:\n    print(e)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "llama_model_loader: - kv" not in p.stderr and len(p.stderr.splitlines()) <= 4, p.stderr
    assert "not within the file bounds" in p.stdout and str(cut) in p.stdout


# -- the real packaged models ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine():
    if not HAVE_LLAMA:
        pytest.skip("llama-cpp-python is not installed (pip install 'specscope[llamacpp]')")
    from measure.engines import make_engine

    return make_engine("llamacpp", EngineOptions(threads=1, quiet=True, max_len_tokens=256))


@pytest.fixture(scope="module")
def prompt(engine, smollm2) -> torch.Tensor:
    return engine.encode(smollm2, MESSAGES[0], 200)


def _greedy(dec: Decoder, ids: torch.Tensor, n: int) -> list[int]:
    """Token-by-token greedy decoding on ``dec`` (the baseline path)."""
    dec.reset()
    logits = dec.forward(ids, last_only=True)
    out = []
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        logits = dec.forward(torch.tensor([[out[-1]]]), last_only=True)
    return out


@pytest.mark.slow
def test_engine_target_and_decoder_follow_the_seam(engine, smollm2, prompt):
    assert isinstance(engine, Engine) and isinstance(smollm2, TargetModel)
    dec = smollm2.new_decoder()
    assert isinstance(dec, Decoder) and dec.n_cached == 0 and dec.vocab_size == 49152
    d = smollm2.describe()
    path = Path(d["source"].removeprefix("gguf:"))
    assert d["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() and d["dtype"] == "Q4_1"
    assert d["engine"] == "llamacpp" and d["params"] > 100e6 and not d["synthetic"]
    assert engine.versions()["llamacpp_threads"] == "1" and engine.versions()["llama_cpp_python"]
    assert 2 in smollm2.eos_token_ids  # <|im_end|>
    ids = prompt[0].tolist()  # ChatML template rendered by llama-cpp-python, special tokens parsed
    assert ids[0] == 1 and ids[-4:] == engine.tokenize(smollm2, "<|im_start|>assistant\n", False, True)


def test_cuda_on_a_cpu_build_is_refused_in_one_line(engine, smollm2):
    if engine.worker.hello["gpu_offload"]:
        assert engine.gpu_layers("cuda") == -1
        return
    with pytest.raises(ValueError) as e:
        engine.gpu_layers("cuda")
    assert "no GPU offload" in str(e.value) and "--kind cuda" in str(e.value) and "\n" not in str(e.value)
    assert engine.gpu_layers("auto") == 0 and engine.gpu_layers("cpu") == 0
    with pytest.raises(ValueError, match="valid: auto, cpu, cuda"):
        engine.gpu_layers("tpu")


@pytest.mark.slow
def test_forward_and_rollback_match_recomputation(smollm2, prompt):
    dec = smollm2.new_decoder()
    P = prompt.shape[1]
    cont = torch.tensor([_greedy(dec, prompt, 12)])  # [1, 12]
    # path A: prompt, 6 tokens, 6 more, roll back to 6, feed token 6
    dec.reset()
    dec.forward(prompt, last_only=True)
    dec.forward(cont[:, :6])
    dec.forward(cont[:, 6:12])
    assert dec.n_cached == P + 12
    dec.rollback(P + 20)  # longer than cached: no-op
    assert dec.n_cached == P + 12
    dec.rollback(P + 6)
    assert dec.n_cached == P + 6
    a = dec.forward(cont[:, 6:8])  # [2, V]
    # path B: the same computation without the extra tokens ever fed
    fresh = smollm2.new_decoder()
    fresh.forward(prompt, last_only=True)
    fresh.forward(cont[:, :6])
    b = fresh.forward(cont[:, 6:8])
    assert a.shape == (2, 49152) and a.dtype == torch.float32
    assert torch.equal(a, b)  # the rolled-back positions left no trace
    dec.reset()
    assert dec.n_cached == 0
    assert torch.equal(dec.forward(prompt, last_only=True), smollm2.new_decoder().forward(prompt, last_only=True))


@pytest.mark.slow
def test_the_greedy_baseline_runs_its_token_loop_in_the_worker(smollm2, prompt):
    from measure.decoding import autoregressive_generate

    dec = smollm2.new_decoder()
    r = autoregressive_generate(dec, prompt, 0.0, 12, None, ())  # one message to the worker, none per token
    assert list(r.tokens) == _greedy(smollm2.new_decoder(), prompt, 12)
    assert dec.n_cached == prompt.shape[1] + 11 and len(r.token_latency_ms) == 12
    assert r.ttft_ms == r.token_latency_ms[0] and abs(sum(r.token_latency_ms) - r.wall_s * 1e3) < 1e-3
    nxt = dec.forward_argmax(torch.tensor([[r.tokens[-1]]]), last_only=True)  # the cache goes on from there
    assert int(nxt) == _greedy(smollm2.new_decoder(), prompt, 13)[-1]


@pytest.mark.slow
def test_the_fast_paths_return_what_the_seams_defaults_compute_from_the_logits(smollm2, prompt):
    """Only ids and a few log-probabilities come back from the worker; they are the logits' own (the same batch:
    the same logits), so the loops lose nothing by taking the fast paths."""
    dec = smollm2.new_decoder()
    for last_only in (False, True):
        dec.reset()
        fast = dec.forward_argmax(prompt, last_only)
        dec.reset()
        assert torch.equal(fast, Decoder.forward_argmax(dec, prompt, last_only))
    dec.reset()
    top, logp = dec.forward_topk_logprobs(prompt, 5)
    dec.reset()
    ref_top, ref_logp = Decoder.forward_topk_logprobs(dec, prompt, 5)
    assert top.shape == logp.shape == (prompt.shape[1], 5) and torch.equal(top[:, 0], ref_top[:, 0])
    torch.testing.assert_close(logp, ref_logp, atol=1e-4, rtol=0)
    assert dec.n_cached == prompt.shape[1] and Decoder.greedy_generate(dec, prompt, 4) is None


@pytest.mark.slow
def test_batched_logits_close_to_sequential(smollm2, prompt):
    dec = smollm2.new_decoder()
    cont = torch.tensor([_greedy(dec, prompt, 9)])  # [1, 9]
    feed = torch.cat([prompt[:, -1:], cont[:, :8]], dim=1)  # [1, 9]: last prompt token + 8
    dec.reset()
    dec.forward(prompt[:, :-1], last_only=True)
    batched = dec.forward(feed)  # [9, V]
    dec.reset()
    dec.forward(prompt[:, :-1], last_only=True)
    seq = torch.cat([dec.forward(feed[:, i:i + 1]) for i in range(9)])  # [9, V]
    assert (batched - seq).abs().max() < 2.0  # llama.cpp's batch noise (~1.5 at most measured), not a shift
    top2 = seq.topk(2, dim=-1).indices  # [9, 2]
    shift = (batched.gather(1, top2).diff(dim=1) - seq.gather(1, top2).diff(dim=1)).abs()
    assert shift.max() < NEAR_TIE_TOLERANCE
    assert seq.argmax(-1).tolist() == cont[0].tolist()  # sequential logits reproduce greedy decoding
    assert (batched.argmax(-1) == seq.argmax(-1)).float().mean() >= 0.75


@pytest.fixture(scope="module")
def greedy_baselines(engine, smollm2, prompt) -> list[tuple[torch.Tensor, list[int]]]:
    """(prompt ids, 24 greedy tokens) for each of :data:`MESSAGES` (the first: ``prompt``): the oracle of every
    lossless test here, decoded once (it depends on neither the draft nor the loop under test)."""
    ids = [prompt] + [engine.encode(smollm2, msg, 200) for msg in MESSAGES[1:]]
    return [(x, _greedy(smollm2.new_decoder(), x, 24)) for x in ids]


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["ngram:3", "model:smollm2-135m", "quant:q8_0"])
def test_greedy_speculative_loop_on_llama_cpp_is_lossless(engine, smollm2, greedy_baselines, spec,
                                                            tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path_factory.getbasetemp() / "spec-cache"))
    draft = engine.make_draft(spec, smollm2, seed=0)
    assert draft.describe()["kind"] in ("ngram", "model", "quant")
    checks = []
    for ids, base in greedy_baselines:
        r = speculative_generate(smollm2.new_decoder(), draft, ids, FixedGamma(4), 0.0, 24, None, smollm2.eos_token_ids)
        spec_out, drafted, accepted = list(r.tokens), r.drafted, r.accepted
        assert accepted <= drafted
        if spec != "ngram:3":
            assert drafted > 0 and accepted > 0  # a copy of the target agrees with it most of the time
        checks.append(check_greedy_lossless(base, spec_out, baseline_logits_at(smollm2.new_decoder(), ids, base)))
    assert all(c.ok for c in checks), checks


@pytest.mark.slow
def test_model_draft_samples_with_its_probabilities_and_rolls_back(engine, smollm2, prompt):
    draft = engine.make_draft("model:smollm2-135m", smollm2, seed=0)
    assert isinstance(draft, ModelDraft)  # the one model draft of every engine
    assert list(draft.describe()) == ["kind", "synthetic", "source", "name", "params", "dtype", "sha256"]
    draft.start(prompt)
    P = prompt.shape[1]
    tokens = torch.cat([prompt, torch.tensor([[28]])], dim=1)
    runs = []
    for _ in range(2):
        draft.rollback(P)
        d_tok, q = draft.propose(tokens, 3, 0.7, torch.Generator().manual_seed(5))
        runs.append(d_tok.tolist())
        assert q.shape == (3, 49152) and torch.allclose(q.sum(-1), torch.ones(3), atol=1e-4)
        assert all(float(q[i, t]) > 0 for i, t in enumerate(d_tok.tolist()))
        assert draft.decoder.n_cached == P + 3  # prompt + the uncached token + 2 fed drafts
    assert runs[0] == runs[1]  # same seed, same cache state → same draft
    probs = draft.position_probs(tokens, P, 0.0)  # teacher-forced, one-hot greedy
    assert probs.shape == (1, 49152) and float(probs.sum()) == 1.0


@pytest.mark.slow
def test_quantised_copy_is_cached_by_the_source_hash(engine, smollm2, tmp_path):
    root = tmp_path / "gguf"

    def quantize(qtype: str) -> tuple[Path, bool]:  # llama.cpp's quantiser runs in the worker, like all of it
        p, made = engine.worker.call("quantize", source=str(smollm2.path), qtype=qtype, threads=1, root=str(root))
        return Path(p), made

    path, made = quantize("q8_0")
    assert made and path.name == f"{smollm2.sha256}-q8_0.gguf" and path.parent == root
    assert path.read_bytes()[:4] == GGUF_MAGIC and not list(root.glob("*.tmp"))
    mtime = path.stat().st_mtime_ns
    again, made2 = quantize("Q8_0")
    assert again == path and not made2 and path.stat().st_mtime_ns == mtime
    assert "q8_0" in QUANT_TYPES


@pytest.mark.slow
def test_draft_with_another_vocabulary_is_refused(engine, smollm2):
    from measure.engines.gguf_files import PACKAGED

    try:
        PACKAGED["gemma3-270m"]()
    except ValueError as e:
        pytest.skip(str(e))
    with pytest.raises(ValueError) as e:
        engine.check_specs("smollm2-135m", ["model:gemma3-270m"])
    msg = str(e.value)
    assert "another vocabulary" in msg and "262144" in msg and "49152" in msg and "\n" not in msg
    with pytest.raises(ValueError, match="another vocabulary"):
        engine.make_draft("model:gemma3-270m", smollm2, seed=0)


@pytest.mark.slow
def test_peer_is_llama_cpp_prompt_lookup_for_the_earliest_match_rule(engine, smollm2, prompt, greedy_baselines):
    from measure.drafts import NGramDraft

    recent = engine.make_draft("ngram:3", smollm2, seed=0)
    assert engine.peer_generate(smollm2, recent, prompt, 4, 0.0, 16, 0) is None  # a rule the library lacks
    first = NGramDraft("ngram:3:first", 3)
    first.rule = "first"
    res = engine.peer_generate(smollm2, first, prompt, 4, 0.0, 24, 0)
    base = greedy_baselines[0][1]  # 24 greedy tokens after ``prompt``
    assert res is not None and len(res.tokens) == 24 and res.wall_s > 0 and res.rounds >= 1
    assert 0 <= res.accepted <= res.drafted
    c = check_greedy_lossless(base, list(res.tokens), baseline_logits_at(smollm2.new_decoder(), prompt, base))
    assert c.ok, c
    hot = [engine.peer_generate(smollm2, first, prompt, 4, 0.8, 12, seed).tokens for seed in (3, 3, 4)]
    assert hot[0] == hot[1] and len(hot[0]) == 12  # seeded sampling reproduces


@pytest.mark.slow
def test_llama_cpp_computes_in_its_own_process_without_torch(engine, smollm2, prompt):
    smollm2.new_decoder().forward_argmax(prompt, last_only=True)
    hello = engine.worker.hello
    assert hello["pid"] != os.getpid() and hello["torch_loaded"] is False
    assert hello["omp_wait_policy"] == os.environ.get("OMP_WAIT_POLICY")  # the user's setting, or none: not ours
    assert hello["cpu_backend"] and hello["cpu_backend"].startswith("libggml-cpu")
    maps = Path("/proc/self/maps").read_text()
    assert "libggml-cpu" not in maps  # this process (torch's) never loaded llama.cpp's compute


@pytest.mark.slow
def test_the_reference_is_a_fresh_llama_cpp_python_process_of_its_own(engine, smollm2, prompt, greedy_baselines):
    lib = engine.library_generate(smollm2, prompt, 0.0, 12, 0)
    ref = engine.reference.hello
    assert ref["pid"] not in (os.getpid(), engine.worker.hello["pid"]) and ref["torch_loaded"] is False
    assert lib.wall_s > 0 and 0 < lib.ttft_ms < lib.wall_s * 1e3  # the prompt is inside the timed span
    base = greedy_baselines[0][1][:12]  # greedy decoding's first 12 tokens after ``prompt``
    c = check_greedy_lossless(base, list(lib.tokens), baseline_logits_at(smollm2.new_decoder(), prompt, base))
    assert c.ok, c  # the library's greedy tokens are ours (or diverge at a near tie)
    # the library's own defaults, not ours: batch 512, flash attention off, f16 cache; our context size and threads
    s = engine.reference.call("settings", path=str(smollm2.path), n_ctx=256, threads=1, gpu_layers=0)
    assert (s["n_ctx"], s["n_batch"], s["n_ubatch"], s["n_threads"], s["n_threads_batch"]) == (256, 256, 256, 1, 1)
    assert "n_ctx=256, n_threads=1" in engine.versions()["llamacpp_reference"]


def test_module_imports_without_llama_cpp():
    code = ("import sys; sys.modules['llama_cpp'] = None; import measure.engines.llamacpp as m; "
            "m.check_specs('gguf:/no.gguf', [])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == \
        "ValueError: --target gguf:/no.gguf: no such file"


@pytest.mark.slow
@needs_llama
def test_measure_calibrate_report_end_to_end_on_llama_cpp(tmp_path):
    """``python -m measure --engine llamacpp`` → calibrate → reports on the packaged SmolLM2, lossless on every cell.

    One llama.cpp thread: the suite runs a test per core, and llama.cpp's threads spin-wait for each other (its
    default runtime, kept as its users run it), so two of them beside another busy worker would crawl. A short
    prompt and 12 tokens: what is tested is that every stage runs and what it records, not a speed. ``measure``
    runs as a process of its own (the llama.cpp user's command); ``calibrate`` and ``reports`` in this one (their
    ``python -m`` entry points are tested in tests/calibrate and tests/reports).
    """
    run, cal = tmp_path / "run", tmp_path / "cal"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    cmd = [sys.executable, "-m", "measure", "--engine", "llamacpp", "--draft", "ngram:3:first", "--gamma", "2,4",
           "--domains", "code", "--prompts", "1", "--max-new-tokens", "12", "--max-prompt-tokens", "64",
           "--repeats", "1", "--threads", "1",
           "--cost-contexts", "32,64", "--cost-max-tokens", "5", "--quiet", "--out", str(run)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    import pandas as pd

    cells = pd.read_csv(run / "cells.csv")
    gens = pd.read_csv(run / "generations.csv")
    assert len(cells) == 2 and (cells["n_lossless_failures"] == 0).all()
    greedy = gens[gens["mode"] != "baseline"]
    assert set(greedy["lossless"]) <= {"identical", "near_tie"} and len(greedy) >= 2
    assert (gens["mode"] == "peer").any()  # llama-cpp-python's own prompt lookup ran beside our loop
    # llama-cpp-python's plain Llama.generate in every visit (in a fresh process of its own), our baseline held
    # against it (a ratio with its CI)
    assert (gens["mode"] == "library").sum() == 2 and (cells["tokens_per_s_library"] > 0).all()
    assert (cells["baseline_vs_library"] > 0).all()  # one visit per cell here: no CI (the sweep tests check it)
    assert "engine's own plain decoding" in p.stdout
    import json

    meta = json.loads((run / "run.json").read_text())
    v = meta["versions"]  # what llama.cpp ran as: its CPU backend and features, its own process without torch
    assert v["engine_llamacpp_cpu_backend"].startswith("libggml-cpu") and "CPU :" in v["engine_llamacpp_system_info"]
    assert v["engine_llamacpp_process"].startswith("own process, torch not loaded")
    assert v["engine_llamacpp_reference"].startswith("a process of its own beside the worker, started fresh")
    assert meta["fingerprint"]["peer"] is True and meta["fingerprint"]["library"] is True
    from tests.support.cli_inprocess import run_module

    for package, args in (("calibrate", [run, "--out", cal]), ("reports", [cal, "--out", tmp_path / "rep", "--no-png"])):
        q = run_module(package, args)
        assert q.returncode == 0, q.stderr[-2000:]
    assert (tmp_path / "rep" / "report.html").exists()
