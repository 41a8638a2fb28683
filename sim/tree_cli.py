"""``python -m sim tree`` — predict a token tree's accepted length and speedup, find the best tree, say if branching pays.

Examples::

    python -m sim tree --paths '[[0],[1],[0,0]]' --acceptance p.json --cost-ratio 0.05
    python -m sim tree --paths '[[0],[1],[0,0]]' --acceptance p.json --preset llama3-1b-8b --format json
    python -m sim tree --budget 16 --max-depth 5 --preset llama3-8b-70b --hardware h100-sxm --tp 4
    python -m sim tree --budget 32 --max-depth 8 --advise --preset llama3-8b-70b --hardware h100-sxm --tp 4
    python -m sim tree --paths '[[0],[1],[0,0]]' --alpha 0.7 --cost-ratio 0.1 --mode event --seed 3

``--acceptance FILE`` holds ``{"p": [[…depth 1 ranks…], […depth 2…], …]}``
(:class:`sim.trees.PositionalAcceptance`), or a chain model as ``calibrate``
and ``calibrate ingest`` write it (``iid``, ``per_position``). A top-1-only
acceptance (a chain file, ``--alpha``, a preset's α) gets its other ranks
from a rank law (:mod:`sim.rank_law`, ``--rank-law``), and the output says so.

Every bad value exits with status 2 and one line naming it, before anything
is computed. Bounds, and why: a tree of at most 256 nodes (Sequoia's largest
on-GPU trees have 128) and depth 64 (the chains' γ limit: 0.9^64 ≈ 0.001);
``--advise`` evaluates every budget 1..N and every depth limit, up to N = 64.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any, Sequence

from presets import HARDWARE, HEAD_KINDS, HEAD_PAIRS, MODELS, PAIRS, Pair
from sim.cli import (
    CliError,
    _add_gpu_flags,
    _resolve_cost,
    _resolve_hardware,
    _resolve_pair,
    _uses_seam,
    check_preset_fits,
    _write_output,
    seam_cost,
)
from sim.cost import CostModel, cost_provenance
from sim.limits import (
    CONTEXT_TOKENS_ARG,
    COST_RATIO_ARG,
    GAMMA_LIMIT,
    GAMMA_WHY,
    MAX_BATCH_LIMIT,
    NEW_TOKENS_LIMIT,
    SEED_LIMIT,
)
from sim.engine_overheads import for_shape
from sim.stepcost import source_lines
from sim.rank_law import DEFAULT_RANK_LAW, DEFAULT_RANKS, RANK_LAWS, RankLaw
from sim.trees import PositionalAcceptance, TokenTree, TreePrediction, load_positional
from toolkit.cli import (
    OneLineParser,
    check_output_file,
    choice_arg,
    fail,
    float_arg,
    float_list_arg,
    int_arg,
    nonempty_arg,
)

PROG = "python -m sim tree"
FORMATS = ("text", "json")
MODES = ("analytic", "event")
RANK_LAW_CHOICES = (*RANK_LAWS, "none")
NODES_LIMIT = 256
NODES_WHY = "Sequoia's largest on-GPU trees have 128 nodes"
DEPTH_LIMIT = GAMMA_LIMIT
ADVISE_BUDGET_LIMIT = 64
NEW_TOKENS_DEFAULT = 4096


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m sim tree`` options; every ``type=`` refuses NaN, ±inf, empty and out-of-range values."""
    p = OneLineParser(prog=PROG, description="Predict a token tree's accepted length and speedup; find the best "
                      "tree for a budget; say whether branching pays and how to set SGLang and vLLM.")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--paths", type=nonempty_arg("path list"), metavar="PATHS",
                      help="the tree as a path list, e.g. '[[0],[1],[0,0]]' (vLLM's '[(0,), (1,)]' too)")
    what.add_argument("--budget", type=int_arg(1, NODES_LIMIT, NODES_WHY), metavar="N",
                      help=f"find the best tree of N draft tokens (1..{NODES_LIMIT}; with --advise 1..{ADVISE_BUDGET_LIMIT})")
    p.add_argument("--max-depth", type=int_arg(1, DEPTH_LIMIT, GAMMA_WHY), metavar="D",
                   help=f"deepest level the tree may have, with --budget (default N, at most {DEPTH_LIMIT})")
    p.add_argument("--advise", action="store_true", help="with --budget: best chain vs best tree for budgets "
                   "1..N, whether branching pays, SGLang's flags and vLLM's speculative_token_tree")
    a = p.add_mutually_exclusive_group()
    a.add_argument("--acceptance", metavar="FILE", type=nonempty_arg("file name"),
                   help='acceptance JSON: {"p": [[depth-1 ranks], [depth-2 ranks], ...]}, or an iid/per_position '
                   "model from calibrate")
    a.add_argument("--alpha", type=float_arg(0.0, 1.0), help="top-1 acceptance at every depth, in [0, 1] "
                   "(default: the preset's)")
    a.add_argument("--alpha-per-position", type=float_list_arg(0.0, 1.0, max_items=DEPTH_LIMIT), metavar="A1,A2,...",
                   help="top-1 (conditional) acceptance per depth; the last repeats")
    p.add_argument("--rank-law", type=choice_arg("rank law", RANK_LAW_CHOICES),
                   help=f"how a top-1-only acceptance gets ranks 2..{DEFAULT_RANKS}: {', '.join(RANK_LAW_CHOICES)} "
                   f"(default {DEFAULT_RANK_LAW}; see sim/rank_law.py)")
    p.add_argument("--preset", type=choice_arg("preset", [*PAIRS, *HEAD_PAIRS]),
                   help="draft/target pair or draft head by exact name")
    p.add_argument("--draft", type=choice_arg("model or draft head", [*MODELS, *HEAD_KINDS]),
                   help=f"draft model name, or a draft head on the target: {', '.join(HEAD_KINDS)} (with --target)")
    p.add_argument("--target", type=choice_arg("model", list(MODELS)), help="target model name (with --draft)")
    p.add_argument("--hardware", type=choice_arg("hardware", list(HARDWARE)), help="hardware profile "
                   "(default: the pair's)")
    _add_gpu_flags(p, batch=False)
    c = p.add_mutually_exclusive_group()
    c.add_argument("--cost-ratio", type=COST_RATIO_ARG, metavar="C",
                   help="pure Leviathan cost model: every draft forward = C x target step, verify = target step")
    c.add_argument("--cost-model", metavar="FILE", type=nonempty_arg("file name"),
                   help="cost model JSON (as written by calibrate)")
    p.add_argument("--context-tokens", type=CONTEXT_TOKENS_ARG, default=512.0,
                   help="context length the costs use (default 512)")
    p.add_argument("--batch", type=int_arg(1, MAX_BATCH_LIMIT), default=1,
                   help="sequences per batched forward, each drafting the same tree (default 1)")
    p.add_argument("--mode", default="analytic", type=choice_arg("mode", MODES),
                   help="analytic (closed form) or event (SimPy rounds of this tree as well)")
    p.add_argument("--new-tokens", type=int_arg(1, NEW_TOKENS_LIMIT), help=f"tokens the event mode simulates "
                   f"(default {NEW_TOKENS_DEFAULT})")
    p.add_argument("--seed", type=int_arg(0, SEED_LIMIT), default=0, help="seed of the event mode (default 0)")
    p.add_argument("--format", default="text", type=choice_arg("format", FORMATS), help="text or json (default text)")
    p.add_argument("--out", metavar="FILE", type=nonempty_arg("file name"), help="write the output here")
    return p


@dataclass(frozen=True)
class TreeSetup:
    """Everything a tree command needs, validated by :func:`resolve`."""

    tree: TokenTree | None
    budget: int | None
    max_depth: int | None
    advise: bool
    acceptance: PositionalAcceptance
    rank_law: str | None
    cost: CostModel
    pair: Pair | None
    hardware: str | None
    context_tokens: float
    batch: int
    mode: str
    new_tokens: int
    seed: int
    notes: tuple[str, ...] = ()

    def search(self) -> tuple[int, int]:
        """The node budget and depth limit of a ``--budget`` run; ``ValueError`` for a ``--paths`` one."""
        if self.budget is None or self.max_depth is None:
            raise ValueError("this tree setup evaluates a given tree (--paths): it has no --budget to search")
        return self.budget, self.max_depth


def _check_flags(args: argparse.Namespace) -> None:
    """Refuse combinations that would be ignored or cannot be computed."""
    if args.paths is None and args.budget is None:
        raise CliError("give --paths PATHS (a tree to evaluate, e.g. '[[0],[1],[0,0]]') or --budget N (find the "
                       "best tree of N draft tokens)")
    if args.max_depth is not None and args.budget is None:
        raise CliError("--max-depth limits the tree --budget N searches for; with --paths the tree's depth is given")
    if args.advise and args.budget is None:
        raise CliError("--advise compares chains and trees for budgets 1..N: give --budget N")
    if args.advise and args.budget > ADVISE_BUDGET_LIMIT:
        raise CliError(f"--budget {args.budget} is out of range with --advise: valid 1..{ADVISE_BUDGET_LIMIT} (the "
                       "advice evaluates every budget 1..N at every depth limit)")
    if args.advise and args.mode != "analytic":
        raise CliError(f"--mode {args.mode} simulates one tree; --advise compares closed forms only")
    if args.new_tokens is not None and args.mode != "event":
        raise CliError(f"--new-tokens applies to --mode event only, not --mode {args.mode}")
    if args.hardware is not None and (args.cost_ratio is not None or args.cost_model is not None):
        flag = "--cost-ratio" if args.cost_ratio is not None else "--cost-model"
        raise CliError(f"--hardware {args.hardware} has no effect with {flag}: the costs come from {flag}")


def _parse_tree(args: argparse.Namespace, pair: Pair | None) -> TokenTree | None:
    if args.paths is None:
        return None
    try:
        tree = TokenTree.parse(args.paths)
    except ValueError as exc:
        raise CliError(f"--paths: {exc}") from None
    if tree.n_nodes > NODES_LIMIT:
        raise CliError(f"--paths has {tree.n_nodes} nodes; at most {NODES_LIMIT} ({NODES_WHY})")
    if tree.depth > DEPTH_LIMIT:
        raise CliError(f"--paths is {tree.depth} deep; at most {DEPTH_LIMIT} ({GAMMA_WHY})")
    if pair is not None:
        vocab, whose = _candidate_vocabulary(pair)
        if tree.max_rank >= vocab:
            raise CliError(f"--paths uses rank {tree.max_rank}: a top-{tree.max_rank + 1} candidate list, more than "
                           f"{whose} of {vocab} tokens; valid ranks 0..{vocab - 1}")
    return tree


def _candidate_vocabulary(pair: Pair) -> tuple[int, str]:
    """How many candidates the draft ranks (an EAGLE-3 head: its own reduced vocabulary), and whose they are."""
    head = pair.head
    if head is not None and head.kind == "eagle3":
        return head.draft_vocab_size, f"{head.name}'s own draft vocabulary"
    return pair.draft.vocab_size, f"{pair.draft.name}'s vocabulary"


def _resolve_acceptance(args: argparse.Namespace,
                        pair: Pair | None) -> tuple[PositionalAcceptance, str | None, tuple[str, ...]]:
    """The positional acceptance (a top-1-only one extended by the rank law), the law used, if any, and notes."""
    notes: tuple[str, ...] = ()
    if args.acceptance is not None:
        acc = load_positional(args.acceptance)
    elif args.alpha is not None:
        acc = PositionalAcceptance.from_chain([args.alpha], f"--alpha {args.alpha:g} at every depth")
    elif args.alpha_per_position is not None:
        acc = PositionalAcceptance.from_chain(args.alpha_per_position, "--alpha-per-position "
                                              + ",".join(f"{a:g}" for a in args.alpha_per_position))
    elif pair is not None:
        from sim.typical import default_alpha

        alpha, why = default_alpha(pair)
        acc = PositionalAcceptance.from_chain([alpha], f"preset {pair.name}: alpha = {alpha:.4g} at every depth ({why})")
        head = pair.head
        if head is not None and head.head_kind.acceptance[0].tree:
            notes = (TREE_TAU_NOTE,)
    else:
        raise CliError("no acceptance given: use --acceptance FILE, --alpha or --alpha-per-position (or a --preset)")
    if not acc.is_chain:
        if args.rank_law is not None:
            raise CliError(f"--rank-law {args.rank_law} applies to a top-1-only acceptance; --acceptance "
                           f"{args.acceptance!r} gives ranks {[len(r) for r in acc.p]} per depth itself")
        return acc, None, notes
    law = args.rank_law or DEFAULT_RANK_LAW
    if law == "none":
        return acc, None, notes
    return RankLaw(law).extend(acc), law, notes


def resolve(args: argparse.Namespace) -> TreeSetup:
    """Validated :class:`TreeSetup` from the arguments; ``CliError``/``ValueError`` (one line) on any bad value."""
    _check_flags(args)
    pair = _resolve_pair(args)
    tree = _parse_tree(args, pair)
    if pair is not None and args.context_tokens > pair.context_window_tokens:
        raise CliError(f"--context-tokens {args.context_tokens:g} is out of range for {pair.name}: "
                       f"{pair.shorter_window_model.name} has {pair.context_window_tokens} positions; "
                       f"valid: 0..{pair.context_window_tokens}")
    if args.out:
        check_output_file("--out", args.out)
    hardware = _resolve_hardware(args, pair)
    acceptance, law, notes = _resolve_acceptance(args, pair)
    if tree is not None:
        try:
            acceptance.check_covers(tree)
        except ValueError as exc:
            raise CliError(f"--paths: {exc}") from None
    depth = args.max_depth or args.budget or (tree.depth if tree else 8)
    if _uses_seam(args):
        if pair is None:
            raise CliError("--engine, --tp, --ep, --dtype, --cost-source and --moe-routing price a pair: give --preset or "
                           "--draft/--target")
        hardware = args.hardware or pair.default_hardware
        cost = seam_cost(args, pair, [depth], args.engine_overhead == "fitted")
        if tree is not None:  # a round of this tree pays a tree's per-round term, or a chain's
            cost = for_shape(cost, not tree.is_chain)
    else:
        check_preset_fits(pair, hardware, args.context_tokens, depth, args.batch)
        cost = _resolve_cost(args, pair, hardware)
    return TreeSetup(tree, args.budget, None if args.budget is None else (args.max_depth or args.budget),
                     args.advise, acceptance, law, cost, pair, hardware, args.context_tokens, args.batch, args.mode,
                     args.new_tokens or NEW_TOKENS_DEFAULT, args.seed, notes)


TREE_TAU_NOTE = ("this head's alpha is inferred from a tau its paper measured with tree drafts: it folds that "
                 "tree's gain into a chain's alpha, so the chains and the trees here are both optimistic; give "
                 "--alpha or an --acceptance file measured on chains")

#: what the rank laws were found to do on real drafts (results/2026-11-24-tree-rank-law.md), said wherever one is used
LAW_CHECK = {
    "power": ("ranks 2..10 come from the power rank law: on SmolLM2-135M's self-drafts it put the best trees' E[tau] "
              "off by -6% to +8% (budgets <= 16) while picking nearly the best shape "
              "(results/2026-11-24-tree-rank-law.md); a tree gain smaller than that depends on the law"),
    "geometric": ("ranks 2..10 come from the geometric rank law, which overstated the top-2..5 recall of "
                  "SmolLM2-135M's self-drafts by 0.05-0.29 RMSE (results/2026-11-24-tree-rank-law.md): an "
                  "optimistic bound on what branching buys"),
}


def _setting(s: TreeSetup) -> dict:
    return {"preset": s.pair.name if s.pair else None, "hardware": s.hardware, "context_tokens": s.context_tokens,
            "batch": s.batch, "acceptance": s.acceptance.describe(), "acceptance_source": s.acceptance.source,
            "rank_law": s.rank_law, "cost_model": s.cost.describe(), "notes": [*s.notes, *([LAW_CHECK[s.rank_law]] if s.rank_law else [])]}


def _prediction_doc(pred: TreePrediction) -> dict:
    d = pred.as_dict()
    probs = d.pop("accepted_length_probs")
    tree = TokenTree(pred.paths)
    return {**d, "verify_tokens": pred.n_nodes + 1, "level_sizes": list(tree.level_sizes),
            "tau_distribution": [{"tau": k, "probability": p} for k, p in enumerate(probs, start=1)],
            "vllm_speculative_token_tree": tree.vllm_string(), "level_uniform": tree.branching is not None}


def run_tree(s: TreeSetup) -> dict:
    """The JSON-able document of a ``--paths`` or ``--budget`` run (one tree)."""
    from sim.trees import predict_tree

    doc: dict[str, Any] = {"command": "tree", **_setting(s)}
    tree = s.tree
    if tree is None:
        from sim.tree_search import optimal_tree

        budget, max_depth = s.search()
        tree = optimal_tree(s.acceptance, budget, max_depth)
        doc["optimal"] = {"budget": budget, "max_depth": max_depth,
                          "criterion": "highest E[tau] of a tree with exactly budget nodes (Sequoia's DP)"}
    pred = predict_tree(tree, s.acceptance, s.cost, s.context_tokens, s.batch)
    doc.update(_prediction_doc(pred))
    if s.mode == "event":
        from sim.events import simulate_request
        from sim.policies import TreePolicy

        res = simulate_request(s.acceptance, s.cost, TreePolicy(tree), s.new_tokens, s.context_tokens, seed=s.seed)
        doc["event"] = {"new_tokens": res.n_tokens, "rounds": res.rounds, "seed": s.seed,
                        "mean_accepted_length": res.tokens_per_round, "speedup": res.speedup,
                        "time_ms": res.time_ms}
    return doc


def run_advice(s: TreeSetup) -> dict:
    """The JSON-able document of ``--advise``."""
    from sim.tree_advice import branching_answer

    budget, max_depth = s.search()
    ans = branching_answer(s.acceptance, s.cost, budget, max_depth, s.context_tokens, s.batch)
    doc = {"command": "tree --advise", **_setting(s), "budget": budget, "max_depth": max_depth, **ans.as_dict()}
    notes = doc["notes"]
    if ans.best_tree.n_nodes == budget:
        notes.append(f"the best tree spends the largest budget searched ({budget}): a larger --budget may do better")
    notes.append("SGLang redraws its tree every round from the draft's confidences; its line is the static "
                 "expected-value tree of the same flags (sim/tree_search.py)")
    notes.append("vLLM's EAGLE proposer drafts the same number of children for every node of a level "
                 "(vllm/v1/spec_decode/eagle.py): its line is the best such tree")
    return doc


def _cost_text(doc: dict) -> str:
    cm = doc["cost_model"]
    if cm.get("kind") == "leviathan":
        where = f"Leviathan et al. cost model, c = {cm['cost_ratio']:g}"
    elif cm.get("kind") == "roofline":
        where = f"roofline of {doc['preset'] or cm['draft']['model'] + ' -> ' + cm['target']['model']} on {doc['hardware']}"
    elif cm.get("kind") == "step":
        where = "; ".join(source_lines(cm))
    else:  # what the file says it is: fitted by calibrate, measured by llama-bench, or supplied by the user
        where = f"{cost_provenance(cm)[0]} (--cost-model)"
    return f"cost: {where}, context {doc['context_tokens']:g} tokens, batch {doc['batch']}"


def format_tree(doc: dict) -> str:
    """One tree in words."""
    head = (f"optimal tree for budget {doc['optimal']['budget']}, depth <= {doc['optimal']['max_depth']} "
            "(Sequoia's DP, highest E[tau]): " if "optimal" in doc else "tree: ")
    probs = "  ".join(f"P(tau={x['tau']}) {x['probability']:.3f}" for x in doc["tau_distribution"])
    lines = [
        f"{head}{json.dumps(doc['paths'])}",
        f"  {doc['n_nodes']} nodes, depth {doc['depth']}, nodes per depth {doc['level_sizes']}: the target verifies "
        f"{doc['verify_tokens']} tokens in one forward",
        f"acceptance: {doc['acceptance_source']}",
        _cost_text(doc),
        f"expected_accepted_length: {doc['expected_accepted_length']:.4f} tokens per round (E[tau], bonus included)",
        f"tau distribution: {probs}",
        f"round: draft {doc['draft_ms']:.4g} ms + verify {doc['verify_ms']:.4g} ms + overhead "
        f"{doc['overhead_ms']:.4g} ms = {doc['round_time_ms']:.4g} ms",
        f"predicted speedup: {doc['speedup']:.3f}x over {doc['tokens_per_s_baseline']:.1f} tok/s autoregressive",
        f"as vLLM's speculative_token_tree: {doc['vllm_speculative_token_tree']}"
        + ("" if doc["level_uniform"] else "  (not level-uniform: stock vLLM's EAGLE proposer gives every node of a "
           "level the same children, so it drafts other trees; --advise finds the best one it can)"),
    ]
    if "event" in doc:
        e = doc["event"]
        lines.append(f"event simulation ({e['rounds']} rounds, {e['new_tokens']} tokens, seed {e['seed']}): mean "
                     f"tau {e['mean_accepted_length']:.4f}, speedup {e['speedup']:.3f}x")
    lines += [f"note: {n}" for n in doc["notes"]]
    return "\n".join(lines)


def format_advice(doc: dict) -> str:
    """The branching answer, the per-budget table and the engines' settings."""
    lines = [f"preset: {doc['preset'] or '-'}   hardware: {doc['hardware'] or '-'}   budgets 1..{doc['budget']}, "
             f"depth <= {doc['max_depth']}",
             f"acceptance: {doc['acceptance_source']}", _cost_text(doc), "", doc["answer"], ""]
    table = [["budget", "chain tau", "chain x", "tree tau", "tree x", "depth", "nodes per depth"]]
    for r in doc["rows"]:
        ch, tr = r["chain"], r["tree"]
        table.append([str(r["budget"]), "-" if ch is None else f"{ch['expected_accepted_length']:.3f}",
                      "-" if ch is None else f"{ch['speedup']:.3f}", f"{tr['expected_accepted_length']:.3f}",
                      f"{tr['speedup']:.3f}", str(tr["depth"]),
                      ",".join(str(x) for x in TokenTree(tuple(map(tuple, tr["paths"]))).level_sizes)])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines += ["  ".join(c.rjust(w) if i < 6 else c for i, (c, w) in enumerate(zip(row, widths))) for row in table]
    sg, vl = doc["sglang"], doc["vllm"]
    lines += ["",
              f"SGLang: {sg['command']}  -> {sg['prediction']['speedup']:.3f}x "
              f"(E[tau] {sg['prediction']['expected_accepted_length']:.3f})",
              f"vLLM:   {vl['command']}  -> {vl['prediction']['speedup']:.3f}x "
              f"(E[tau] {vl['prediction']['expected_accepted_length']:.3f})"]
    lines += [f"note: {n}" for n in doc["notes"]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sim tree``: 0 on success; one ``python -m sim tree: error: ...`` line and exit status 2 on bad input."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        setup = resolve(args)
        doc = run_advice(setup) if setup.advise else run_tree(setup)
        if args.format == "json":
            text = json.dumps(doc, indent=2)
        else:
            text = format_advice(doc) if setup.advise else format_tree(doc)
        _write_output(text, args.out)
    except (CliError, ValueError) as exc:
        fail(PROG, str(exc))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
