"""presets — named model pairs and hardware profiles, so the simulator works with no measurement.

Pure data plus the analytic cost functions that belong next to it:
:mod:`presets.models` (architecture numbers, FLOPs and bytes of a forward),
:mod:`presets.hardware` (roofline profiles), :mod:`presets.pairs` (draft/target
pairs with a default α and its source).
"""

from presets.hardware import HARDWARE, Hardware, RooflineForward, get_hardware
from presets.models import MODELS, ModelSpec, get_model
from presets.pairs import PAIRS, Pair, get_pair, make_pair

__all__ = [
    "HARDWARE", "Hardware", "MODELS", "ModelSpec", "PAIRS", "Pair", "RooflineForward",
    "get_hardware", "get_model", "get_pair", "make_pair",
]
