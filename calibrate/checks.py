"""Checks of a calibration's predictions against what any cost model allows (said in the calibration's notes).

**A speedup curve cannot jump.** From γ to γ + 1 a round gains one draft step
and one more verified token. A round of γ ≥ 1 already holds at least one
draft step and one verified token, so — when a forward of more tokens takes
no less time — the round's time grows by at most its own time, and never
shrinks; its expected tokens never fall (a longer draft loses no accepted
token) and grow by at most one, no more than it had. So the predicted
speedup can at most halve and at most double from one γ to the next. A curve
that does more (issue #28: 1.62× at γ = 4, 0.07× at γ = 5, from one cost point
timed while the machine was busy) rests on a cost table no physical forward
has; :func:`curve_jumps` names it.
"""

from __future__ import annotations

import pandas as pd

#: The most a predicted speedup may change by (either way) from γ to γ + 1 (module docstring).
MAX_STEP = 2.0


def curve_jumps(curves: pd.DataFrame, max_step: float = MAX_STEP) -> list[str]:
    """One note per predicted speedup curve (``Calibrator.curves``: run, series, method, gamma,
    predicted_speedup) whose speedup changes by more than ``max_step`` times between neighbouring γ."""
    notes: list[str] = []
    if curves.empty:
        return notes
    for (run, series, method), sub in curves.groupby(["run", "series", "method"], sort=True):
        sub = sub.sort_values("gamma")
        g, v = sub["gamma"].to_numpy(), sub["predicted_speedup"].to_numpy(float)
        for i in range(1, len(v)):
            if g[i] != g[i - 1] + 1 or not (v[i] > 0 and v[i - 1] > 0):
                continue
            step = v[i] / v[i - 1]
            if step > max_step or step < 1 / max_step:
                notes.append(
                    f"{run}: the predicted speedup curve of {series} ({method}) jumps from {v[i - 1]:.2f}x at "
                    f"γ = {g[i - 1]} to {v[i]:.2f}x at γ = {g[i]}: no cost model allows that (one more draft "
                    f"token can at most halve or double a speedup); look at its cost table near {g[i] + 1} tokens "
                    "(cost_target.csv) for a point timed while the machine was busy")
                break
    return notes
