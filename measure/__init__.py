"""measure — real speculative decoding with PyTorch + transformers.

Importing the package must stay torch-free: :mod:`measure.records` (the run
directory format) is read by ``calibrate`` and ``reports`` on machines without
torch. Everything that needs torch lives in submodules.
"""
