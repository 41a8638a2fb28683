"""The transformers engine: HF causal LMs behind the seam (:mod:`measure.seam`).

* :mod:`~measure.engines.transformers.decoder` — :class:`TransformersDecoder`, one model's KV-cached
  sequence (static cache with O(1) roll-back, optional ``torch.compile``), and the bare-model helpers;
* :mod:`~measure.engines.transformers.models` — loading models by spec (hub id, directory, GGUF file,
  packaged name, synthetic preset);
* :mod:`~measure.engines.transformers.drafts` — the transformers-only draft kinds, built by spec;
* :mod:`~measure.engines.transformers.engine` — :class:`TransformersEngine` and transformers' own
  speculative decoding as the peer.

``make_engine``, ``check_specs`` and ``context_tokens`` are what :func:`measure.engines.make_engine`,
:func:`measure.engines.check_specs` and :func:`measure.engines.context_tokens` call.
"""

from __future__ import annotations

from measure.engines.transformers.decoder import TransformersDecoder
from measure.engines.transformers.engine import (TransformersEngine, check_specs, context_tokens, make_engine,
                                                 peer_generate)

__all__ = ["TransformersDecoder", "TransformersEngine", "check_specs", "context_tokens", "make_engine",
           "peer_generate"]
