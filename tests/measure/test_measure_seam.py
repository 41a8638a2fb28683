"""The seam's base classes: every optional ability has a default computed from the plain forward, an engine's fast
path returns what the default does, and each engine declares (overrides) the fast paths it has, so that a renamed
or missing one cannot fall back silently."""

from __future__ import annotations

import torch

from measure.decoding import autoregressive_generate, proposal_runs, speculative_generate
from measure.drafts import ModelDraft, NGramDraft, NGramIndex
from measure.engines.llamacpp import LlamaCppDecoder, LlamaCppTarget, LlamaCppTreeDecoder
from measure.engines.transformers.decoder import TransformersDecoder
from measure.engines.transformers.models import LoadedModel
from measure.seam import Decoder, Draft, TargetModel, TreeDecoder, topk_logprobs
from sim.policies import FixedGamma
from tests.support.fake_engine import ToyDecoder, ToyEngine, ToyLM

V = 11
#: every fast path of the seam, by the base class that declares it
FAST_PATHS = {Decoder: ("forward_argmax", "forward_topk_logprobs", "forward_topk", "greedy_generate"),
              TreeDecoder: ("forward_tree_argmax", "forward_tree_topk"),
              Draft: ("observe", "new_index")}
#: what each engine's class declares, i.e. overrides; the rest are the seam's defaults on purpose (the
#: transformers decoder's logits stay on the device in this process: its top-k and tree paths are the defaults)
DECLARED = {
    LlamaCppDecoder: {"forward_argmax", "forward_topk_logprobs", "greedy_generate"},
    LlamaCppTreeDecoder: {"forward_argmax", "forward_topk_logprobs", "greedy_generate", "forward_tree_argmax",
                          "forward_tree_topk"},
    TransformersDecoder: {"forward_argmax", "forward_topk"},
    ModelDraft: set(),
    NGramDraft: {"observe", "new_index"},
}


class TableDecoder(ToyDecoder, TreeDecoder):
    """A tree decoder (the toy's cache bookkeeping) whose logits are a fixed random table of the fed token and its
    position, with every fast path the seam's default."""

    forward_argmax = Decoder.forward_argmax  # the seam's default, not the toy's fast path

    def __init__(self) -> None:
        super().__init__(ToyLM(vocab=V, step_s=0.0))
        self.table = torch.randn(V, 64, V, generator=torch.Generator().manual_seed(0))

    def forward(self, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        pos = torch.arange(self._n, self._n + input_ids.shape[1])
        self._n += int(input_ids.shape[1])
        logits = self.table[input_ids[0], pos]
        return logits[-1:] if last_only else logits

    def forward_tree(self, input_ids: torch.Tensor, prefix_tokens: int, slot_positions: torch.Tensor,
                     visible: torch.Tensor) -> torch.Tensor:
        m = int(input_ids.shape[1])
        pos = slot_positions[-m:]
        self._n += m
        return self.table[input_ids[0], pos]

    def keep_slots(self, start: int, slots: list[int]) -> None:
        self._n = start + len(slots)


def test_the_decoders_defaults_are_computed_from_its_forward():
    dec, ids = TableDecoder(), torch.tensor([[3, 1, 4, 1, 5]])
    want = dec.forward(ids)
    dec.reset()
    assert torch.equal(dec.forward_argmax(ids), want.argmax(-1)) and dec.n_cached == 5
    dec.reset()
    assert torch.equal(dec.forward_argmax(ids, last_only=True), want[-1:].argmax(-1))
    dec.reset()
    top, logp = dec.forward_topk_logprobs(ids, 3)
    ref_logp, ref_top = torch.log_softmax(want, -1).topk(3)
    assert torch.equal(top, ref_top) and torch.equal(logp, ref_logp) and dec.n_cached == 5
    assert topk_logprobs(want, 50)[0].shape == (5, V)  # k capped at the vocabulary
    assert dec.forward_topk(ids) is None and dec.n_cached == 5  # no kept-vocabulary head: nothing fed
    assert dec.greedy_generate(ids, 4) is None  # no loop of its own: the caller runs it


def test_the_tree_decoders_defaults_are_computed_from_its_tree_forward():
    dec = TableDecoder()
    ids, pos, vis = torch.tensor([[2, 7, 9]]), torch.tensor([4, 5, 5]), torch.ones(3, 3, dtype=torch.bool)
    logits = dec.forward_tree(ids, 4, pos, vis)
    assert torch.equal(dec.forward_tree_argmax(ids, 4, pos, vis), logits.argmax(-1))
    top, logp = dec.forward_tree_topk(ids, 4, pos, vis, 2)
    ref_logp, ref_top = torch.log_softmax(logits, -1).topk(2)
    assert torch.equal(top, ref_top) and torch.equal(logp, ref_logp)


def test_a_decoder_without_its_own_loop_gets_the_callers_greedy_loop():
    dec, ids = TableDecoder(), torch.tensor([[3, 1, 4]])
    r = autoregressive_generate(dec, ids, 0.0, 5)
    dec.reset()
    want, x = [], ids
    for _ in range(5):
        want.append(int(dec.forward(x)[-1].argmax()))
        x = torch.tensor([[want[-1]]])
    assert list(r.tokens) == want


def test_a_model_drafts_defaults_observe_nothing_and_have_no_index():
    draft = ModelDraft("model:table", "model", TableDecoder())
    draft.observe([1, 2, 3])
    assert draft.new_index([1, 2]) is None
    tokens = torch.tensor([[3, 1, 4, 1, 5, 9, 2]])
    proposed, runs = proposal_runs(draft, tokens, 3, [1.0, 0.0, 1.0, 1.0], gamma_max=3)
    assert proposed == [3, 3, 2, 1] and runs == [1, 0, 2, 1]  # a model draft's runs follow teacher forcing
    assert isinstance(NGramDraft("ngram:2", 2).new_index([1, 2, 1]), NGramIndex)


def test_the_fake_engines_fast_path_returns_the_seams_default():
    engine = ToyEngine(step_s=0.0)
    target = engine.load_target("toy", device="cpu", dtype="float32", seed=0)
    ids = engine.encode(target, "the fake engine's fast path", 64)
    fast, slow = target.new_decoder(), target.new_decoder()
    for last_only in (False, True):
        fast.reset()
        slow.reset()
        assert torch.equal(fast.forward_argmax(ids, last_only), Decoder.forward_argmax(slow, ids, last_only))
        assert fast.n_cached == slow.n_cached == ids.shape[1]
    draft = engine.make_draft("ngram:2", target, seed=0)
    r = speculative_generate(target.new_decoder(), draft, ids, FixedGamma(3), 0.0, 12)
    plain = autoregressive_generate(slow, ids, 0.0, 12)
    assert r.tokens == plain.tokens


def test_each_engine_declares_its_fast_paths():
    """An engine's class overrides exactly the fast paths it is known to have: a renamed one (say
    ``forward_tree_argmx``) would leave the seam's default in place, and this fails."""
    for cls, declared in DECLARED.items():
        bases = [b for b in FAST_PATHS if b in cls.__mro__]  # explicit subclasses (issubclass: protocols)
        assert bases, cls
        overridden = {name for b in bases for name in FAST_PATHS[b] if getattr(cls, name) is not getattr(b, name)}
        assert overridden == declared, cls.__name__
    assert TreeDecoder in LlamaCppTreeDecoder.__mro__ and TreeDecoder in TransformersDecoder.__mro__
    assert TreeDecoder not in LlamaCppDecoder.__mro__  # a chain context has no tree forward
    assert TargetModel in LlamaCppTarget.__mro__ and TargetModel in LoadedModel.__mro__
