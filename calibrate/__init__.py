"""calibrate — fit the simulator's cost and acceptance models to measured runs and validate it.

Torch-free; reads run directories through :mod:`measure.records` and predicts
with :mod:`sim`. Modules: :mod:`calibrate.fit_cost` (least-squares cost fits),
:mod:`calibrate.fit_acceptance` (i.i.d., per-position, decay families, traces),
:mod:`calibrate.calibration` (hold-out folds, predictions, MAPE),
:mod:`calibrate.outputs` (files). CLI: ``python -m calibrate``.
"""
