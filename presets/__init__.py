"""presets — named model pairs and hardware profiles, so the simulator works with no measurement.

Pure data plus the analytic cost functions that belong next to it:
:mod:`presets.models` (architecture numbers, FLOPs and bytes of a forward),
:mod:`presets.hardware` (roofline profiles), :mod:`presets.pairs` (draft/target
pairs with a default α and its source).
"""

from presets.hardware import HARDWARE, Hardware, RooflineForward, get_hardware
from presets.heads import HEAD_KINDS, HeadSpec, PublishedAcceptance, get_head_kind
from presets.models import MODELS, ModelSpec, get_model
from presets.pairs import HEAD_PAIRS, PAIRS, Pair, get_pair, head_pair, make_pair

__all__ = [
    "HARDWARE", "HEAD_KINDS", "HEAD_PAIRS", "Hardware", "HeadSpec", "MODELS", "ModelSpec", "PAIRS", "Pair",
    "PublishedAcceptance", "RooflineForward", "get_hardware", "get_head_kind", "get_model", "get_pair", "head_pair",
    "make_pair",
]
