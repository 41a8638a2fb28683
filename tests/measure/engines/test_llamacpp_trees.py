"""Token trees on the llama.cpp engine: one ``llama_decode`` per tree (its tokens carrying the sequence ids of the
paths through them), only the accepted path kept, the tree drafters on llama.cpp, and ``python -m measure tree
--engine llamacpp``.

Fast: the tree mask read back as parents (:func:`measure.engines.llamacpp.tree_parents`), the sequences a tree
needs, the worker's top-k log-probabilities, bad input before any model loads. Slow (the packaged SmolLM2-135M
Q4_1 GGUF): greedy tree output against plain greedy decoding on a one-sequence context, the cache after a round,
tree logits against the same path fed in order, and a small run directory.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from measure.engines.lossless import NEAR_TIE_TOLERANCE, baseline_logits_at, check_greedy_lossless
from measure.engines.llamacpp_native.runtime import top_logprobs
from measure.seam import EngineOptions, TreeDecoder
from measure.trees.loop import (
    LLAMACPP_MAX_SEQUENCES,
    DraftTree,
    check_tree_option,
    make_tree_drafter,
    parse_tree_option,
    tree_generate,
    tree_sequences,
    verify_tree,
)

HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
TREES = ("[[0],[1],[0,0]]", "depth=3,topk=2,budget=5")
MESSAGES = ("Write a Python function that returns the n-th Fibonacci number, with a docstring and a test.",
            "Explain the difference between a list and a tuple in Python.")


# -- the mask read back as a tree (no model) -----------------------------------------------------
def _verify_mask(parents: list[int]) -> torch.Tensor:
    """The visibility verify_tree builds for a root (index 0) and nodes with ``parents`` (-1: the root)."""
    par = [-1] + [p + 1 for p in parents]
    anc: list[set[int]] = []
    for i, p in enumerate(par):
        anc.append(({i} | anc[p]) if p >= 0 else {i})
    vis = torch.zeros(len(par), len(par), dtype=torch.bool)
    for i, a in enumerate(anc):
        vis[i, sorted(a)] = True
    return vis


def test_tree_mask_reads_back_as_parents_and_positions():
    from measure.engines.llamacpp import tree_parents

    # root, then [[0],[1],[0,0],[0,1],[1,0]]: nodes 0, 1 under the root, 2, 3 under 0, 4 under 1
    vis = _verify_mask([-1, -1, 0, 0, 1])
    pos = torch.tensor([9, 10, 10, 11, 11, 11])
    parents, sees = tree_parents(9, 9, [], pos, vis)
    assert parents == [-1, 9, 9, 10, 10, 11]  # absolute slots: the root is slot 9, node i slot 10 + i
    assert sees[3] == frozenset({0, 1, 3})
    # a second batch hanging from cached slots (a draft's next level): slot 10 + 3 = 13 is node 2
    more = torch.zeros(2, 8, dtype=torch.bool)
    more[0, [0, 1, 3, 6]] = True  # a child of node 2 (slot 12)
    more[1, [0, 2, 5, 7]] = True  # a child of node 4 (slot 14)
    p2, _ = tree_parents(9, 15, sees, torch.cat([pos, torch.tensor([12, 12])]), more)
    assert p2 == [12, 14]


@pytest.mark.parametrize("change, needle", [
    ("sibling", "not a tree node"),        # a node that also sees its sibling
    ("position", "at position 12"),        # a node one position too deep
    ("own", "not a tree node"),            # a node that does not see itself
])
def test_a_mask_that_is_not_a_tree_is_one_line(change, needle):
    from measure.engines.llamacpp import tree_parents

    vis = _verify_mask([-1, -1, 0])
    pos = torch.tensor([9, 10, 10, 11])
    if change == "sibling":
        vis[2, 1] = True
    elif change == "position":
        pos[3] = 12
    else:
        vis[3, 3] = False
    with pytest.raises(ValueError) as e:
        tree_parents(9, 9, [], pos, vis)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_sequences_a_tree_needs_and_the_llama_cpp_limit():
    assert tree_sequences(parse_tree_option("[[0],[1],[0,0]]")) == 3  # leaves [1], [0,0]; inner [0]: 1 + 2
    assert tree_sequences(parse_tree_option("[[0],[0,0],[0,0,0]]")) == 3  # one leaf, two inner nodes
    assert tree_sequences(parse_tree_option("depth=3,topk=2,budget=5")) == 6  # 5 leaves at most; 2x2 fed
    assert tree_sequences(parse_tree_option("depth=4,topk=3,budget=4")) == 10  # a draft feeds 3 per level
    check_tree_option(parse_tree_option("depth=3,topk=2,budget=5"), draft_spec="quant:q8_0", engine="llamacpp")
    check_tree_option(parse_tree_option("[[0],[1],[0,0]]"), draft_spec="ngram:3", engine="llamacpp")
    too_many = parse_tree_option("depth=2,topk=200,budget=256")
    assert tree_sequences(too_many) > LLAMACPP_MAX_SEQUENCES
    check_tree_option(too_many, draft_spec="ngram:3")  # the transformers engine has no such limit
    with pytest.raises(ValueError, match="257 sequences .* above llama.cpp's 256"):
        check_tree_option(too_many, draft_spec="ngram:3", engine="llamacpp")
    with pytest.raises(ValueError, match="cannot branch"):
        check_tree_option(parse_tree_option("depth=2,topk=2"), draft_spec="ngram:3:first", engine="llamacpp")
    with pytest.raises(ValueError, match="greedy only"):
        check_tree_option(parse_tree_option("depth=2,topk=2"), draft_spec="quant:q8_0", engine="llamacpp",
                          temperature=0.5)


def test_worker_top_k_log_probabilities_match_torch():
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(5, 300)).astype(np.float32) * 4
    rows[2, [7, 11]] = rows[2].max() + 1.0  # a tie at the top: the lower id first
    ids, logp = top_logprobs(rows, 8)
    ref = torch.log_softmax(torch.from_numpy(rows).double(), -1)
    vals, ref_ids = torch.topk(ref, 8)
    assert ids[2][:2] == [7, 11]
    assert [set(r) for r in ids] == [set(r) for r in ref_ids.tolist()]
    assert np.allclose(np.array(logp), vals.numpy(), atol=1e-6)
    assert all(a >= b for row in logp for a, b in zip(row, row[1:]))
    assert top_logprobs(rows, 1000)[0][0] == np.argsort(-rows[0], kind="stable").tolist()


# -- python -m measure tree --engine llamacpp: bad input before any model loads ----------------------
@pytest.mark.parametrize("argv, needle", [
    (["--draft", "ngram:3:first", "--tree", "depth=2,topk=2"], "cannot branch"),
    (["--draft", "quant:q8_0", "--tree", "depth=2,topk=2", "--temperature", "0.7"], "greedy only"),
    (["--draft", "bf16", "--tree", "depth=2,topk=2"], "not a draft of --engine llamacpp"),
    (["--draft", "quant:q3", "--tree", "depth=2,topk=2"], "unknown quantisation type"),
    (["--draft", "ngram:3", "--tree", "depth=2,topk=200,budget=256"], "above llama.cpp's 256"),
    (["--draft", "ngram:3", "--tree", "[[0],[0,0,1]]"], "skips depth"),
    (["--target", "gguf:/nonexistent.gguf", "--draft", "ngram:3", "--tree", "depth=2,topk=2"], "nonexistent"),
])
def test_llama_cpp_tree_cli_bad_input_exits_2_before_loading(tmp_path, monkeypatch, argv, needle):
    from measure.__main__ import main
    from measure.engines import llamacpp
    from tests.support.cli_inprocess import run_main

    def no_start(*a, **k):
        raise AssertionError("the llama.cpp worker was started")

    monkeypatch.setattr(llamacpp.LlamaCppEngine, "_start", no_start)
    target = [] if "--target" in argv else ["--target", "smollm2-135m"]
    r = run_main(main, ["tree", "--engine", "llamacpp", *target, *argv, "--out", str(tmp_path / "run")])
    err = r.stderr.strip()
    assert r.returncode == 2 and needle in err and "\n" not in err, err
    assert not (tmp_path / "run").exists()


def test_tree_run_contexts_get_the_sequences_of_their_widest_tree():
    from measure.trees.run import TreeRunConfig, run_tree_sequences, sweep_config

    opts = [parse_tree_option(t) for t in TREES]
    assert run_tree_sequences(opts) == 6 and run_tree_sequences([]) == 0
    cfg = TreeRunConfig.of("smollm2-135m", "ngram:3", TREES, engine="llamacpp")
    assert sweep_config(cfg, opts).engine == "llamacpp"
    with pytest.raises(ValueError, match="tree_sequences -1"):
        EngineOptions(tree_sequences=-1)


# -- the packaged SmolLM2-135M GGUF ------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine():
    """The llama.cpp engine of a tree run (its contexts hold the sequences of :data:`TREES`); the ``smollm2``
    fixture loads the packaged model with it."""
    if not HAVE_LLAMA:
        pytest.skip("llama-cpp-python is not installed (python -m measure build-llamacpp)")
    from measure.engines import make_engine

    e = make_engine("llamacpp", EngineOptions(threads=1, quiet=True, max_len_tokens=256,
                                              tree_sequences=max(tree_sequences(parse_tree_option(t))
                                                                 for t in TREES)))
    yield e
    e.close()


def _chain_decoder(target):
    """A one-sequence context (llama.cpp's defaults, as every chain run) over ``target``'s weights."""
    from measure.engines.llamacpp import LlamaCppDecoder

    return LlamaCppDecoder(target)


def _plain_greedy(target, ids: torch.Tensor, n: int) -> list[int]:
    """Token-by-token greedy decoding on a one-sequence context: the oracle."""
    dec = _chain_decoder(target)
    out = [int(dec.forward_argmax(ids, last_only=True)[0])]
    while len(out) < n and out[-1] not in target.eos_token_ids:
        out.append(int(dec.forward_argmax(torch.tensor([[out[-1]]]), last_only=True)[0]))
    return out


#: Tokens each generation of the greedy-tree test decodes: every tree shape runs several rounds in them.
GREEDY_TOKENS = 24


@pytest.fixture(scope="module")
def plain_greedy(engine, smollm2) -> list[tuple[torch.Tensor, list[int]]]:
    """(prompt ids, plain greedy decoding of :data:`GREEDY_TOKENS`) for each of :data:`MESSAGES`: the oracle,
    decoded once for every draft of the greedy-tree test (it does not depend on the draft)."""
    out = []
    for msg in MESSAGES:
        ids = engine.encode(smollm2, msg, 120)
        out.append((ids, _plain_greedy(smollm2, ids, GREEDY_TOKENS)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("draft_spec", ["ngram:3", "quant:q8_0"])
def test_greedy_trees_on_llama_cpp_reproduce_plain_greedy_decoding(engine, smollm2, plain_greedy, draft_spec,
                                                                   tmp_path_factory, monkeypatch):
    """Every tree's output is plain greedy decoding's, up to a flip at a near tie of the target's logits (the
    engine's lossless criterion: llama.cpp's batched logits move by up to ~1.5, its top-two margins by up to
    0.42, so its own chain loop is not token-identical either); and a chain-shaped tree gives the chain loop's
    output token for token (the same tokens verified in the same-sized batch at the same positions)."""
    from measure.decoding import speculative_generate
    from measure.engines.llamacpp import LlamaCppTreeDecoder
    from sim.policies import FixedGamma

    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path_factory.getbasetemp() / "spec-cache"))
    draft = engine.make_draft(draft_spec, smollm2, seed=0)
    assert isinstance(smollm2.new_decoder(), LlamaCppTreeDecoder)
    accepted, n = 0, GREEDY_TOKENS
    for ids, base in plain_greedy:
        for text in TREES:
            gen = tree_generate(smollm2.new_decoder(), make_tree_drafter(draft, parse_tree_option(text)), ids, 0.0,
                                n, smollm2.eos_token_ids)
            accepted += gen.result.accepted
            out = list(gen.result.tokens)
            if out != base:  # llama.cpp's batch noise may flip a near tie; never more (measure's lossless check)
                check = check_greedy_lossless(base, out, baseline_logits_at(_chain_decoder(smollm2), ids, base))
                assert check.status == "near_tie", (text, check)
        chain = speculative_generate(smollm2.new_decoder(), draft, ids, FixedGamma(4), 0.0, n, None,
                                     smollm2.eos_token_ids)
        tree = tree_generate(smollm2.new_decoder(), make_tree_drafter(draft, parse_tree_option("depth=4,topk=1")),
                             ids, 0.0, n, smollm2.eos_token_ids).result
        assert tree.tokens == chain.tokens and tree.accepted == chain.accepted
    assert accepted > 0


@pytest.mark.slow
def test_after_a_round_the_cache_holds_exactly_the_context_and_the_accepted_path(smollm2, engine):
    ids = engine.encode(smollm2, MESSAGES[0], 120)
    cont = _plain_greedy(smollm2, ids, 6)
    L = ids.shape[1] + 1
    tokens = torch.cat([ids, torch.tensor([cont[:1]])], dim=1)  # [1, L]: the prompt and the first token
    # a tree whose rank-0 path is the target's own continuation (accepted), with wrong siblings beside it
    wrong = [(t + 1) % smollm2.vocab_size for t in cont]
    tree = DraftTree((cont[1], wrong[1], cont[2], wrong[2], cont[3]), (-1, -1, 0, 0, 2), (0, 1, 0, 1, 0))
    dec = smollm2.new_decoder()
    dec.forward_argmax(tokens[:, :-1], last_only=True)
    verdict = verify_tree(dec, tokens, tree)
    assert verdict.accepted == (0, 2, 4) and verdict.bonus == cont[4]
    n = L + 3
    assert dec.n_cached == n and dec.cached_sequences() == {0: (0, n - 1)}  # one sequence, no other path's cells
    # the next token on the kept cache equals a fresh one-sequence context fed the same tokens
    seq = torch.cat([tokens, torch.tensor([cont[1:4]])], dim=1)  # [1, n]
    nxt = torch.tensor([[cont[4]]])
    after_tree = dec.forward(nxt)[0]
    fresh = _chain_decoder(smollm2)
    fresh.forward(seq, last_only=True)
    ref = fresh.forward(nxt)[0]
    assert int(after_tree.argmax()) == int(ref.argmax()) == cont[5]
    assert (after_tree - ref).abs().max() < 2.0  # llama.cpp's batch noise bound (test_engine_llamacpp.py)
    # the next round works from there: a second tree on the same decoder
    tokens2 = torch.cat([seq, nxt], dim=1)
    dec.rollback(n)
    verdict2 = verify_tree(dec, tokens2, DraftTree((cont[5],), (-1,), (0,)))
    assert verdict2.accepted == (0,) and dec.cached_sequences() == {0: (0, n + 1)}


@pytest.mark.slow
def test_the_tree_fast_paths_return_what_the_seams_defaults_compute_from_the_tree_logits(smollm2, engine):
    """A tree's argmaxes and top-k log-probabilities from the worker are those of its logits (one tree decode
    each, the same batch)."""
    ids = engine.encode(smollm2, MESSAGES[0], 60)
    tree = DraftTree((5, 6, 7), (-1, -1, 0), (0, 1, 0))
    L = ids.shape[1] + 1
    tokens = torch.cat([ids, torch.tensor([[9]])], dim=1)
    feed = torch.tensor([[9, *tree.tokens]])
    pos = torch.tensor([L - 1 + d for d in (0,) + tree.depths])
    vis = _verify_mask(list(tree.parents))
    dec = smollm2.new_decoder()
    dec.forward(tokens[:, :-1], last_only=True)
    fast = dec.forward_tree_argmax(feed, L - 1, pos, vis)
    dec.rollback(L - 1)
    assert torch.equal(fast, TreeDecoder.forward_tree_argmax(dec, feed, L - 1, pos, vis))
    dec.rollback(L - 1)
    top, logp = dec.forward_tree_topk(feed, L - 1, pos, vis, 4)
    dec.rollback(L - 1)
    ref_top, ref_logp = TreeDecoder.forward_tree_topk(dec, feed, L - 1, pos, vis, 4)
    assert top.shape == (4, 4) and torch.equal(top[:, 0], ref_top[:, 0])
    torch.testing.assert_close(logp, ref_logp, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_tree_node_logits_equal_the_same_path_fed_in_order(smollm2, engine):
    """Each node's logits in one tree decode against its path fed to a one-sequence context as one batch
    (root and path): equal within llama.cpp's batch noise, and with the same top-2 order wherever the margin
    exceeds the near-tie tolerance.

    Tolerance: a llama.cpp row's logits depend on the batch it is computed in (its matrix kernels change with
    the batch's size), by up to 1.47 for a single logit and 0.42 for the top-two margin in the chain engine's
    measurement (:data:`~measure.engines.lossless.NEAR_TIE_TOLERANCE`; test_engine_llamacpp.py bounds it by
    2.0 and 0.5). A tree row is the same computation in another batch: 9 prompts x 6 nodes measured here were
    bitwise equal to the path's own batch in 44 of 54 rows, at most 0.57 apart (margins 0.42). A masking
    error (a sibling seen, the context missing) moves logits by whole units and flips the argmax."""
    ids = engine.encode(smollm2, MESSAGES[1], 120)
    cont = _plain_greedy(smollm2, ids, 4)
    other = [(t + 7) % smollm2.vocab_size for t in cont]
    tree = DraftTree((cont[1], other[1], cont[2], other[2], cont[3]), (-1, -1, 0, 1, 2), (0, 1, 0, 0, 0))
    tokens = torch.cat([ids, torch.tensor([cont[:1]])], dim=1)
    L = tokens.shape[1]
    dec = smollm2.new_decoder()
    dec.forward(tokens[:, :-1], last_only=True)
    parents = (-1,) + tuple(p + 1 for p in tree.parents)
    vis = _verify_mask(list(tree.parents))
    pos = torch.tensor([L - 1 + d for d in (0,) + tree.depths])
    tree_logits = dec.forward_tree(torch.tensor([[cont[0], *tree.tokens]]), L - 1, pos, vis)  # [6, V]
    worst = 0.0
    for node in range(len(parents)):
        path, j = [], node
        while j >= 0:
            path.insert(0, j)
            j = parents[j]
        feed = torch.tensor([[cont[0], *[tree.tokens[k - 1] for k in path[1:]]]])
        ref_dec = _chain_decoder(smollm2)
        ref_dec.forward(tokens[:, :-1], last_only=True)
        ref = ref_dec.forward(feed)[-1]
        got = tree_logits[node]
        worst = max(worst, float((got - ref).abs().max()))
        top2 = ref.topk(2).indices
        margin_ref, margin_got = float(ref[top2[0]] - ref[top2[1]]), float(got[top2[0]] - got[top2[1]])
        assert abs(margin_ref - margin_got) < NEAR_TIE_TOLERANCE, (node, margin_ref, margin_got)
        if margin_ref > NEAR_TIE_TOLERANCE:
            assert int(got.argmax()) == int(ref.argmax()), node
    assert worst < 2.0, worst


@pytest.mark.slow
def test_llama_cpp_tree_run_is_lossless_and_records_its_context(tmp_path):
    if not HAVE_LLAMA:
        pytest.skip("llama-cpp-python is not installed")
    from measure.__main__ import main
    from measure.records import load_run
    from tests.support.cli_inprocess import run_main

    out = tmp_path / "run"
    r = run_main(main, ["tree", "--engine", "llamacpp", "--target", "smollm2-135m", "--draft", "ngram:3",
                        "--tree", TREES[0], "--tree", TREES[1], "--gamma", "2", "--prompts", "1",
                        "--max-new-tokens", "16", "--repeats", "1", "--warmup", "0", "--no-cost-curves",
                        "--threads", "1", "--quiet", "--out", str(out)])
    assert r.returncode == 0, r.stderr
    run = load_run(out)
    cells = run.table("tree_cells")
    assert list(cells["loop"]) == ["tree", "tree", "chain"] and cells["n_lossless_failures"].eq(0).all()
    assert run.meta["config"]["engine"] == "llamacpp"
    assert run.meta["config"]["engine_options"]["tree_sequences"] == 6
    assert run.meta["versions"]["engine_llamacpp_tree_context"].startswith("n_seq_max=6, kv_unified=true")
    assert len(run.table("tree_nodes")) > 0
