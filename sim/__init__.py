"""sim — predict speculative-decoding speedup: closed forms and a SimPy event simulator.

Torch-free. Owns the domain types the other packages speak: acceptance models
(:mod:`sim.acceptance`), cost models (:mod:`sim.cost`), γ policies
(:mod:`sim.policies`), the analytic predictor (:mod:`sim.analytic`) and the
event simulator (:mod:`sim.events`); token trees (:mod:`sim.trees`,
:mod:`sim.tree_search`, :mod:`sim.rank_law`, :mod:`sim.tree_advice`).
"""
