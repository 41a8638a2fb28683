"""Tests of measure.drafts that need no model: the incremental n-gram index, the lookup rules, draft specs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from measure.drafts import (DraftSpec, NGramDraft, NGramIndex, check_draft_spec, ngram_lookup, parse_draft_spec,
                            parse_layers)

seqs = st.lists(st.integers(0, 5), min_size=0, max_size=60)  # a small alphabet: many repeats


@pytest.mark.parametrize("rule", ["recent", "first"])
@given(seq=seqs, n=st.integers(1, 4), gamma=st.integers(1, 9), eos=st.sampled_from([(), (0,), (2, 4)]))
def test_incremental_index_equals_brute_force_at_every_length(rule, seq, n, gamma, eos):
    idx = NGramIndex(n, rule, eos)
    assert idx.propose(gamma) == ngram_lookup([], n, gamma, rule, eos) == []
    for i, t in enumerate(seq):
        idx.append(t)
        assert idx.propose(gamma) == ngram_lookup(seq[:i + 1], n, gamma, rule, eos), (i, seq[:i + 1])


@given(seq=seqs, n=st.integers(1, 4), gamma=st.integers(1, 9))
def test_first_rule_is_transformers_prompt_lookup(seq, n, gamma):
    """ngram:N:first proposes what transformers' PromptLookupCandidateGenerator proposes (no EOS given)."""
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    if len(seq) < 2:
        return
    gen = PromptLookupCandidateGenerator(num_output_tokens=gamma, max_matching_ngram_size=n, max_length=10_000)
    ids = torch.tensor([seq])
    cand, _ = gen.get_candidates(ids)
    theirs = cand[0, len(seq):].tolist()
    assert ngram_lookup(seq, n, gamma, "first") == theirs


def test_first_rule_cuts_at_eos_like_transformers():
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    seq = [1, 2, 7, 9, 3, 1, 2]
    gen = PromptLookupCandidateGenerator(eos_token_id=torch.tensor([9]), num_output_tokens=4,
                                         max_matching_ngram_size=2, max_length=100)
    assert gen.get_candidates(torch.tensor([seq]))[0][0, len(seq):].tolist() == [7]
    assert ngram_lookup(seq, 2, 4, "first", (9,)) == [7]
    assert ngram_lookup(seq, 2, 4, "recent", (9,)) == [7, 9, 3, 1]  # today's rule keeps EOS


def test_recent_and_first_rules_differ_where_expected():
    seq = [4, 1, 2, 4, 3, 4]
    assert ngram_lookup(seq, 1, 2, "recent") == [3, 4]
    assert ngram_lookup(seq, 1, 2, "first") == [1, 2]
    d = NGramDraft("ngram:2", 2)
    assert d.lookup([5, 6, 7, 8, 5, 6], 3) == [7, 8, 5]
    assert d.lookup([1, 2, 3], 4) == []
    assert d.lookup([9, 1, 2, 9, 3, 9], 2) == [3, 9]  # most recent earlier occurrence of [9]


def test_ngram_draft_follows_the_loop_and_catches_up_without_observe():
    d = NGramDraft("ngram:2:first", 2, "first")
    prompt = torch.tensor([[1, 2, 3, 1, 2]])
    d.start(prompt)
    tok, q = d.propose(prompt, 3, 0.0, None)
    assert tok.tolist() == [3, 1, 2] and q is None
    longer = torch.tensor([[1, 2, 3, 1, 2, 3, 1]])  # two tokens never observed
    assert d.propose(longer, 2, 0.0, None)[0].tolist() == ngram_lookup(longer[0].tolist(), 2, 2, "first")
    shorter = torch.tensor([[5, 6, 5]])  # another sequence: rebuilt
    assert d.propose(shorter, 2, 0.0, None)[0].tolist() == [6, 5]


@pytest.mark.parametrize("spec, msg", [
    ("ngram:0", "'ngram:0': N must be an integer >= 1"),
    ("ngram:abc", "'ngram:abc': N must be an integer >= 1"),
    ("ngram:3:last", "unknown matching rule 'last'"),
    ("model:", "'model:': needs a model spec"),
    ("early:abc", "'early:abc': N must be an integer >= 1"),
    ("early:0", "'early:0'"),
    ("layers:5-2", "layer range 5-2 is descending"),
    ("layers:", "needs a layer list"),
    ("layers:a-b", "bad layer list"),
    ("int8:x", "takes no argument"),
    ("", "empty draft spec"),
    ("nope", "unknown draft kind 'nope'; valid: model:<spec>"),
])
def test_parse_draft_spec_errors_are_one_line(spec, msg):
    with pytest.raises(ValueError) as e:
        parse_draft_spec(spec)
    assert msg in str(e.value) and "\n" not in str(e.value) and "valid:" in str(e.value)


def test_parse_draft_spec_round_trips_and_normalises():
    for text in ("ngram", "ngram:3", "ngram:3:first", "model:smollm2-135m", "early:8", "layers:0-5,20-29", "bf16",
                 "int8", "fp16", "model:gguf:/x/y.gguf"):
        ds = parse_draft_spec(text)
        assert DraftSpec.parse(ds.to_str()) == ds and ds.to_str() == text
    assert parse_draft_spec("ngram:03").to_str() == "ngram:3"
    assert parse_draft_spec("ngram:4:first").ngram == (4, "first") and parse_draft_spec("ngram").ngram == (3, "recent")


def test_check_draft_spec_layer_bounds_without_a_model():
    assert check_draft_spec("early:29", 30).arg == "29"
    with pytest.raises(ValueError, match=r"'early:999': needs 1 <= N < 30"):
        check_draft_spec("early:999", 30)
    with pytest.raises(ValueError, match=r"layer 40 out of range: the target has layers 0..29"):
        check_draft_spec("layers:0-3,38-40", 30)
    assert check_draft_spec("ngram:2", 30) == DraftSpec("ngram", "2")
    assert check_draft_spec("early:999", None).arg == "999"  # no layer count known: syntax only
    assert parse_layers("0-2,5", 6) == [0, 1, 2, 5]
