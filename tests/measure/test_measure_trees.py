"""Token trees in measure (measure.trees): tree drafts, one-forward verification, lossless output, the
counterfactual rank record, bad input, and the ``python -m measure tree`` run directory."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from measure.decoding import autoregressive_generate
from measure.drafts import ngram_lookup
from measure.engines.transformers.drafts import make_draft
from measure.engines.transformers.models import load_model
from measure.seam import EngineOptions
from measure.trees.loop import (
    DraftTree,
    accept_tree,
    check_tree_option,
    lookup_candidates,
    make_tree_drafter,
    parse_tree_option,
    tree_generate,
    verify_tree,
)
from tests.support.tiny_models import save_tiny as _save_tiny, tiny_prompt as _prompt, without_eos


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = {fam: load_model(_save_tiny(tmp_path_factory.mktemp(fam), fam)) for fam in ("llama", "gpt2", "gemma3")}
    out["llama-draft-dir"] = _save_tiny(tmp_path_factory.mktemp("llama-d"), "llama", seed=3)
    out["llama-dir"] = without_eos(_save_tiny(tmp_path_factory.mktemp("llama-t"), "llama"))
    return out


TREES = ["depth=3,topk=2,budget=5", "[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0]]", "depth=4,topk=1", "depth=2,topk=3"]
DRAFTS = ["early:2", "layers:0,3", "int8", "bf16", "ngram:2", "ngram:3", "model"]


def _draft(tiny, target, spec):
    return make_draft(f"model:{tiny['llama-draft-dir']}" if spec == "model" else spec, target)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
@pytest.mark.parametrize("draft_spec", DRAFTS)
def test_greedy_tree_equals_baseline(tiny, family, draft_spec):
    """Every draft kind, every tree shape (fixed, per-round beam, chain): the baseline's tokens exactly."""
    if draft_spec == "model" and family != "llama":
        pytest.skip("the separate draft model shares the llama tiny's vocabulary only")
    target = tiny[family]
    for seed in (1,):  # one prompt: a shared 2-core machine runs these tiny forwards slowly
        ids = _prompt(target.vocab_size, n=14, seed=seed)
        base = autoregressive_generate(target.new_decoder(), ids, 0.0, 28)
        draft = _draft(tiny, target, draft_spec)
        for text in TREES if family == "llama" else TREES[:2]:  # a per-round beam and a fixed tree elsewhere
            opt = parse_tree_option(text)
            gen = tree_generate(target.new_decoder(), make_tree_drafter(draft, opt), ids, 0.0, 28)
            assert gen.result.tokens == base.tokens, (text, gen.result.tokens, base.tokens)
            assert sum(r.accepted for r in gen.result.rounds) + len(gen.result.rounds) + 1 == 28
            for tr in gen.tree_rounds:
                assert tr.round.drafted == len(tr.depths) <= opt.budget
                assert all(d <= opt.depth for d in tr.depths)
                acc = [i for i, a in enumerate(tr.accepted) if a]
                assert [tr.depths[i] for i in acc] == list(range(1, len(acc) + 1))  # one path from the root
                assert all(tr.parents[b] == a for a, b in zip([-1] + acc, acc))


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_tree_on_both_caches_and_branches_get_accepted(tiny, cache):
    """A rank > 0 candidate is accepted in some round (branching does something) and output stays identical."""
    target = replace(tiny["llama"], engine_options=EngineOptions(cache=cache))
    draft = make_draft("early:2", target)
    opt = parse_tree_option("depth=3,topk=3,budget=9")
    ranks_accepted = []
    for seed in (1, 2, 3):
        ids = _prompt(target.vocab_size, n=14, seed=seed)
        base = autoregressive_generate(target.new_decoder(), ids, 0.0, 30)
        gen = tree_generate(target.new_decoder(), make_tree_drafter(draft, opt), ids, 0.0, 30)
        assert gen.result.tokens == base.tokens
        ranks_accepted += [r for tr in gen.tree_rounds for r, a in zip(tr.ranks, tr.accepted) if a]
    assert any(r > 0 for r in ranks_accepted), ranks_accepted


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_tree_forward_logits_and_moved_kv_equal_sequential(tiny, family):
    """Each node's logits equal feeding its path token by token; the kept path's KV equals a fresh prefill's."""
    target = tiny[family]
    V = target.vocab_size
    ids = _prompt(V, n=14, seed=4)
    tree = DraftTree(tokens=(5, 7, 9, 11, 13, 17), parents=(-1, -1, 0, 0, 1, 3), ranks=(0, 1, 0, 1, 0, 0))
    dec = target.new_decoder()
    dec.reset()
    dec.forward(ids[:, :-1])
    L = ids.shape[1]
    parents = (-1,) + tuple(p + 1 for p in tree.parents)
    m = len(parents)
    vis = torch.zeros(m, m, dtype=torch.bool)
    for i in range(m):
        j = i
        while j >= 0:
            vis[i, j] = True
            j = parents[j]
    pos = torch.tensor([L - 1 + d for d in (0,) + tree.depths])
    x = torch.tensor([[int(ids[0, -1]), *tree.tokens]])
    logits = dec.forward_tree(x, L - 1, pos, vis)  # [7, V]
    for node in range(len(tree.tokens)):
        path = []
        j = node
        while j >= 0:
            path.append(tree.tokens[j])
            j = tree.parents[j]
        seq = torch.cat([ids, torch.tensor([path[::-1]])], dim=1)
        fresh = target.new_decoder()
        full = fresh.forward(seq)[-1]
        torch.testing.assert_close(logits[node + 1], full, rtol=1e-4, atol=1e-4)
    # accept the path root → node 0 → node 3 → node 5 and check the cache against a fresh prefill
    am = [0] * m
    am[0], am[1], am[4], am[6] = 5, 11, 17, 3
    verdict = accept_tree(tree, am)
    assert verdict.accepted == (0, 3, 5) and verdict.bonus == 3
    dec.keep_slots(L, [L + i for i in verdict.accepted])
    assert dec.n_cached == L + 3
    fresh = target.new_decoder()
    fresh.forward(torch.cat([ids, torch.tensor([[5, 11, 17]])], dim=1))
    for a, b in zip(dec.cache.layers, fresh.cache.layers):
        torch.testing.assert_close(a.keys[:, :, :L + 3], b.keys[:, :, :L + 3], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(a.values[:, :, :L + 3], b.values[:, :, :L + 3], rtol=1e-4, atol=1e-4)
    # and the next step after the kept path decodes as if the path had been fed one token at a time
    torch.testing.assert_close(dec.forward(torch.tensor([[3]]))[-1], fresh.forward(torch.tensor([[3]]))[-1],
                               rtol=1e-4, atol=1e-4)


def test_verify_tree_keeps_the_cache_invariant(tiny):
    target = tiny["llama"]
    ids = _prompt(target.vocab_size, n=10, seed=5)
    dec = target.new_decoder()
    dec.reset()
    dec.forward(ids[:, :-1])
    greedy = autoregressive_generate(target.new_decoder(), ids, 0.0, 3).tokens  # the first token is the root's argmax
    dec.reset()
    dec.forward(ids[:, :-1])
    t0 = greedy[0]
    tree = DraftTree(tokens=((t0 + 1) % target.vocab_size, t0), parents=(-1, -1), ranks=(0, 1))
    verdict = verify_tree(dec, ids, tree)
    assert verdict.accepted == (1,)  # the rank-1 sibling is the target's token
    assert dec.n_cached == ids.shape[1] + 1


def test_model_drafter_shapes(tiny):
    target = tiny["llama"]
    ids = _prompt(target.vocab_size, n=12, seed=6)
    draft = make_draft("bf16", target)
    static = parse_tree_option("[[0],[1],[0,0],[0,1],[1,0]]")
    d = make_tree_drafter(draft, static)
    d.start(ids[:, :-1])
    tree = d.propose(ids)
    assert tree.paths() == static.paths.paths and draft.decoder.n_cached == ids.shape[1]
    beam = parse_tree_option("depth=3,topk=2,budget=4")
    d = make_tree_drafter(draft, beam)
    d.start(ids[:, :-1])
    tree = d.propose(ids)
    assert tree.n_nodes == 4 and max(tree.depths) <= 3 and len(set(tree.paths())) == 4
    chain = make_tree_drafter(draft, parse_tree_option("depth=3,topk=1"))
    chain.start(ids[:, :-1])
    tokens = list(chain.propose(ids).tokens)
    seq = ids
    for t in tokens:  # the chain is the draft's greedy continuation
        with torch.no_grad():
            nxt = int(draft.model(input_ids=seq).logits[0, -1].argmax())
        assert nxt == t
        seq = torch.cat([seq, torch.tensor([[t]])], dim=1)


def test_lookup_candidates_rank0_is_the_chain_proposal():
    seq = [1, 2, 3, 9, 1, 2, 4, 8, 5, 1, 2, 3, 7, 6, 1, 2]
    conts = lookup_candidates(seq, 3, 4, 3)
    assert list(conts[0]) == ngram_lookup(seq, 3, 3, "recent")
    assert conts == [(3, 7, 6), (4, 8, 5), (3, 9, 1)][:len(conts)] and len(conts) == 3
    assert lookup_candidates([1, 2, 3], 3, 4, 3) == []


def test_lookup_drafter_builds_a_trie_of_matches(tiny):
    target = tiny["llama"]
    draft = make_draft("ngram:2", target)
    seq = torch.tensor([[1, 2, 3, 9, 1, 2, 4, 8, 5, 1, 2, 3, 7, 6, 1, 2]])
    d = make_tree_drafter(draft, parse_tree_option("depth=3,topk=3"))
    d.start(seq)
    tree = d.propose(seq)
    # branches (3, 7, 6), (4, 8, 5), (3, 9, 1): 3 shared at depth 1
    assert tree.tokens[:2] == (3, 4) and tree.ranks[:2] == (0, 1)
    assert sorted(tree.paths()) == [(0,), (0, 0), (0, 0, 0), (0, 1), (0, 1, 0), (1,), (1, 0), (1, 0, 0)]
    d = make_tree_drafter(draft, parse_tree_option("depth=3,topk=3,budget=4"))
    d.start(seq)
    assert d.propose(seq).n_nodes == 4


@pytest.mark.parametrize("text, needle", [
    ("[[0],[0,0,1]]", "skips depth"),
    ("[[0],[1,0]]", "no parent"),
    ("[[0],[0]]", "appears twice"),
    ("[[0],[-1]]", "negative rank"),
    ("depth=0,topk=2", "depth=0 must be >= 1"),
    ("depth=3,topk=2,budget=0", "budget=0 must be >= 1"),
    ("depth=3,topk=-1", "topk=-1 must be >= 1"),
    ("depth=3,topk=2,budget=11", "exceeds the 10 candidates"),
    ("depth=3", "needs topk=N"),
    ("depth=3,topk=2,width=4", "'width=4' is not one of"),
    ("depth=x,topk=2", "is not an integer"),
    ("depth=65,topk=1", "depth=65 is above 64"),
    ("depth=9,topk=4,budget=300", "budget=300 is above 256"),
    ("[[0],", "is not a path list"),
])
def test_bad_tree_option_one_line(text, needle):
    with pytest.raises(ValueError) as e:
        parse_tree_option(text)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and msg.startswith("--tree ")


def test_tree_option_checks_against_draft_engine_model():
    opt = parse_tree_option("depth=4,topk=2,budget=8")
    cases = [
        ({"draft_spec": "ngram:3:first"}, "cannot branch"),
        ({"draft_spec": "bf16", "engine": "vllm"}, "valid: --engine transformers, llamacpp"),
        ({"draft_spec": "bf16", "temperature": 0.7}, "greedy only"),
        ({"draft_spec": "bf16", "context_tokens": 4}, "depth 4 does not fit"),
        ({"draft_spec": "bf16", "context_tokens": 8}, "budget 8 (+ the root) exceeds"),
        ({"draft_spec": "bf16", "vocab_size": 1}, "topk 2 exceeds the vocabulary of 1"),
    ]
    for kw, needle in cases:
        with pytest.raises(ValueError, match=re.escape(needle)):
            check_tree_option(opt, **kw)
    check_tree_option(opt, draft_spec="ngram:3", context_tokens=9, vocab_size=2)
    check_tree_option(parse_tree_option("depth=4,topk=1"), draft_spec="ngram:3:first")  # a chain needs no branching


def test_tree_generate_refuses_sampling(tiny):
    target = tiny["llama"]
    d = make_tree_drafter(make_draft("ngram:2", target), parse_tree_option("depth=2,topk=2"))
    with pytest.raises(ValueError, match="greedy only"):
        tree_generate(target.new_decoder(), d, _prompt(target.vocab_size), 0.5, 8)


# -- python -m measure tree ----------------------------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["--draft", "bf16", "--tree", "[[0],[0,0,1]]"], "skips depth"),
    (["--draft", "bf16", "--tree", "[[0],[1,0]]"], "no parent"),
    (["--draft", "bf16", "--tree", "[[0],[0]]"], "appears twice"),
    (["--draft", "bf16", "--tree", "depth=0,topk=2"], "depth=0 must be >= 1"),
    (["--draft", "bf16", "--tree", "depth=2,topk=2,budget=0"], "budget=0 must be >= 1"),
    (["--draft", "ngram:3:first", "--tree", "depth=2,topk=2"], "cannot branch"),
    (["--draft", "bf16", "--tree", "depth=2,topk=2", "--temperature", "0.8"], "greedy only"),
    (["--draft", "bf16", "--tree", "depth=2,topk=2", "--engine", "llamacpp"], "unknown model for --engine llamacpp"),
    (["--draft", "bf16"], "give at least one tree"),
    (["--draft", "nope", "--tree", "depth=2,topk=2"], "unknown draft kind"),
])
def test_tree_cli_bad_input_exits_2_before_loading(tiny, tmp_path, capsys, monkeypatch, argv, needle):
    from measure.__main__ import main
    from measure.engines.transformers import models

    def no_load(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(models, "load_model", no_load)
    target = tiny["llama-dir"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["tree", "--target", target, *argv, "--out", str(tmp_path / "run")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err, err
    assert not (tmp_path / "run").exists()


def test_tree_cli_context_and_vocab_checked_from_config(tiny, tmp_path, capsys):
    from measure.__main__ import main

    target = tiny["llama-dir"]  # vocabulary 96, 512 positions
    capsys.readouterr()
    for tree, needle in (("depth=2,topk=97", "topk 97 exceeds the vocabulary of 96"),
                         ("depth=9,topk=2,budget=31", "= 513 tokens exceeds the target's context of 512")):
        with pytest.raises(SystemExit) as e:
            main(["tree", "--target", target, "--draft", "bf16", "--tree", tree, "--max-prompt-tokens", "480",
                  "--max-new-tokens", "1", "--out", str(tmp_path / "r")])
        assert e.value.code == 2 and needle in capsys.readouterr().err


def test_tree_cli_small_run_writes_lossless_records(tiny, tmp_path, capsys):
    from measure.__main__ import main
    from measure.records import load_run

    target = tiny["llama-dir"]
    out = tmp_path / "run"
    rc = main(["tree", "--target", target, "--draft", "early:2", "--tree", "depth=3,topk=2,budget=5",
               "--tree", "[[0],[1],[0,0]]", "--gamma", "2", "--prompts", "1", "--max-new-tokens", "12",
               "--repeats", "2", "--warmup", "0", "--no-cost-curves", "--out", str(out)])
    assert rc == 0, capsys.readouterr()
    run = load_run(out)
    cells = run.table("tree_cells")
    assert list(cells["loop"]) == ["tree", "tree", "chain"]
    assert list(cells["shape"]) == ["depth=3,topk=2,budget=5", "[[0],[1],[0,0]]", "gamma=2"]
    assert cells["outputs_identical"].all()
    nodes = run.table("tree_nodes")
    assert set(nodes["cell_id"]) == set(cells["cell_id"][:2])
    rounds = run.table("rounds")
    tree_rounds = rounds[rounds["cell_id"] == cells["cell_id"][0]]
    per_round = nodes[nodes["cell_id"] == cells["cell_id"][0]].groupby(["prompt_id", "repeat", "round"])
    assert sorted(per_round["accepted"].sum().tolist()) == sorted(tree_rounds["accepted"].tolist())
    assert (per_round.size().to_numpy() <= 5).all()
    gens = run.table("generations")
    assert set(gens["mode"]) == {"baseline", "speculative"} and len(gens) == 3 * 2 * 2
    assert set(gens.loc[gens["mode"] == "speculative", "lossless"]) == {"identical"}
    assert run.status == "complete" and run.meta["config"]["kind"] == "trees"
    # the counterfactual record: per tree round, the positions the target decided, each with its rank
    ranks = run.table("tree_ranks")
    assert set(ranks["cell_id"]) == set(cells["cell_id"][:2])
    first = ranks[ranks["cell_id"] == cells["cell_id"][0]]
    per_round = first.groupby(["prompt_id", "repeat", "round"])
    assert (per_round["depth"].min() == 1).all()  # the root is always ranked
    assert first["rank"].between(-1, 7).all() and (first["candidates"] == 8).all()
    assert not run.table("cost_target").size  # --no-cost-curves


@pytest.mark.slow
@pytest.mark.parametrize("draft_spec", ["bf16", "ngram:3"])  # early:N: on the tiny models of every family
def test_smollm2_trees_lossless(smollm2, draft_spec):
    """The packaged SmolLM2-135M: every tree shape reproduces the baseline for a self-draft and prompt lookup
    (20 tokens: several rounds of every shape; the bf16 self-draft's every drafted token is a model forward)."""
    from measure.prompts import encode_prompt, load_prompts

    target, n = smollm2, 20
    ids = encode_prompt(load_prompts("code", 1, seed=0)[0], target, 120)
    base = autoregressive_generate(target.new_decoder(), ids, 0.0, n, eos_token_ids=target.eos_token_ids)
    draft = make_draft(draft_spec, target)
    for text in ("depth=3,topk=2,budget=6", "[[0],[1],[0,0],[0,0,0]]", "depth=4,topk=1"):
        gen = tree_generate(target.new_decoder(), make_tree_drafter(draft, parse_tree_option(text)), ids, 0.0, n,
                            target.eos_token_ids)
        assert gen.result.tokens == base.tokens, text


def test_target_ranks_agree_with_the_accepted_path(tiny):
    """Where a node was accepted, the counterfactual record gives its rank at its depth; the bonus position's
    rank (if ranked) is one no drafted child of the leaf has."""
    target = tiny["llama"]
    draft = make_draft("early:2", target)
    seen = 0
    for text in ("depth=3,topk=3,budget=9", "[[0],[1],[2],[0,0],[1,0],[0,0,0]]"):
        for seed in (1, 2):
            gen = tree_generate(target.new_decoder(), make_tree_drafter(draft, parse_tree_option(text)),
                                _prompt(target.vocab_size, n=14, seed=seed), 0.0, 24)
            for tr in gen.tree_rounds:
                acc = [i for i, a in enumerate(tr.accepted) if a]
                by_depth = {d: (r, k) for d, r, k in tr.target_ranks}
                assert 1 in by_depth and all(k == 8 for _, k in by_depth.values())
                for d, i in enumerate(acc, start=1):
                    if d in by_depth:
                        assert by_depth[d][0] == tr.ranks[i]
                        seen += 1
                leaf = acc[-1] if acc else -1
                bonus = len(acc) + 1
                if bonus in by_depth:
                    drafted = {tr.ranks[j] for j, p in enumerate(tr.parents) if p == leaf}
                    assert by_depth[bonus][0] not in drafted
    assert seen > 0


def test_lookup_tree_ranks_come_from_more_matches_than_drafted():
    """The lookup draft ranks up to RANKED matches at every node it reached, whatever it drafted: a child's rank
    does not depend on how many matches the tree drafts."""
    from measure.drafts import NGramDraft
    from measure.trees.loop import RANKED, LookupTreeDrafter, trie

    seq = [1, 2, 3, 9, 1, 2, 4, 8, 5, 1, 2, 6, 7, 1, 2, 3, 7, 6, 1, 2]
    conts = lookup_candidates(seq, 2, RANKED, 3)
    full = trie(conts, 3)
    assert full.ranked[-1] == (3, 6, 4)  # every distinct next token after "1 2", most recent match first
    d = LookupTreeDrafter(NGramDraft("ngram:2", 2), parse_tree_option("[[0],[0,0]]"))
    tree = d.propose(torch.tensor([seq]))
    assert tree.tokens == (3, 7) and tree.ranked[-1] == (3, 6, 4)
    assert tree.target_ranks((0,), (3, 9)) == ((1, 0, 3), (2, 1, 2))  # after "3": 7 (rank 0), then 9 (rank 1)


def test_tree_cell_id_round_trips():
    from measure.ids import TreeCellId

    for shape in ("[[0],[1],[0,0]]", "depth=3,topk=2,budget=5", "gamma=4"):
        cid = TreeCellId("int8", shape, "code,conversation")
        assert TreeCellId.parse(cid.to_str()) == cid
    for bad in ("draft=a|shape=b|temp=0.7|domain=c", "draft=a|gamma=fixed:4|temp=0|domain=c"):
        with pytest.raises(ValueError, match="expected draft="):
            TreeCellId.parse(bad)


def test_tree_run_cost_curves_reach_past_the_widest_tree():
    """The cost curves time 1..max(budget + 1, 16) tokens (the advice prices budgets the run did not draft), the
    verified ones (1..budget + 1) with more repeats."""
    from measure.costpoints import plan_cost_points
    from measure.trees.run import TreeRunConfig, sweep_config

    cfg = TreeRunConfig.of("smollm2-135m", "int8", ("[[0],[1],[0,0]]",), (4,))
    plan = plan_cost_points(sweep_config(cfg, [parse_tree_option(t) for t in cfg.trees]), {"code": [100, 120]})
    assert plan.max_tokens == 16 and plan.n_verified == 5  # gamma=4 is the widest round: 5 tokens verified
