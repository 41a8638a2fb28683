"""The race section of the report (reports/race.py): each candidate's ratio to the leader at each look, when
it was eliminated or resolved, why the race stopped, the prior's part; read from run.json's race alone."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from reports.builder import table_html
from reports.race import race_chart, race_frame, race_html, race_sections, short_names
from tests.support.fixtures_runs import make_run


def test_the_frame_has_every_measured_candidate_at_every_look(race_record) -> None:
    df = race_frame(race_record)
    code = df[df["group"] == "code T=0"]
    assert sorted(code["pass"].unique()) == [1, 2, 3]
    first = code[code["pass"] == 1].set_index("label")
    assert "gamma=fixed:2" not in first.index, "a deferred candidate with no units is not drawn"
    assert first.loc["gamma=fixed:8", "status"] == "leader" and first.loc["gamma=fixed:8", "ratio"] == 1.0
    second = code[code["pass"] == 2].set_index("label")
    assert second.loc["gamma=fixed:4", "status"] == "eliminated" and second.loc["gamma=fixed:4", "hi"] == 0.93
    assert df[(df["group"] == "k=4 c=8") & (df["pass"] == 2)].set_index("label").loc["k=4", "status"] == "resolved"


def test_the_chart_has_a_panel_per_group_with_intervals(race_record) -> None:
    spec = race_chart(race_frame(race_record), 0.02).to_dict()
    assert len(spec["vconcat"]) == 2
    titles = [p["title"] for p in spec["vconcat"]]
    assert titles == ["code T=0", "k=4 c=8"]
    marks = [layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"]
             for layer in spec["vconcat"][0]["layer"]]
    assert marks.count("rule") == 3 and "point" in marks  # intervals, the leader's line, the regret line


def test_the_text_says_when_each_went_and_what_the_prior_did(race_record) -> None:
    text = race_html(race_record, race_frame(race_record), table_html)
    assert "Stopped by: <b>decided</b>" in text
    assert "eliminated after pass 2" in text, "γ = 4"
    assert "eliminated after pass 3" in text, "γ = 2, by its check"
    assert "resolved after pass 2" in text, "the serving group's k=4"
    assert "saved 3 units" in text and "eliminated (ratio 0.600, 2 units)" in text
    assert "deferred" in text and "0.940" in text


def test_names_drop_what_a_group_shares() -> None:
    names = short_names(["draft=a|gamma=fixed:2|domain=code", "draft=a|gamma=fixed:4|domain=code", "off"])
    assert names == {"draft=a|gamma=fixed:2|domain=code": "gamma=fixed:2",
                     "draft=a|gamma=fixed:4|domain=code": "gamma=fixed:4", "off": "off"}


def test_a_damaged_race_is_one_line(race_record) -> None:
    with pytest.raises(ValueError, match="run.json race: 'looks'"):
        race_frame({**race_record, "looks": {"0": {}}})
    bad = json.loads(json.dumps(race_record))
    del bad["looks"][0]["groups"]["code T=0"]["leader"]
    with pytest.raises(ValueError, match="has no leader"):
        race_frame(bad)


def test_a_run_without_a_race_has_no_section() -> None:
    assert race_sections({"r": {"config": {}}}) == []


@pytest.mark.slow
def test_the_report_of_a_raced_run_shows_the_race(tmp_path, race_record) -> None:
    from calibrate.calibration import calibrate
    from calibrate.outputs import write_outputs
    from reports.page import build_report

    make_run(tmp_path / "run", seed=3, gammas=(1, 2), domains=("code",), prompts_per_domain=2, max_new_tokens=32,
             repeats=2)
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    (tmp_path / "run" / "run.json").write_text(json.dumps({**meta, "race": race_record}))
    write_outputs(calibrate([tmp_path / "run"], holdout="gamma"), tmp_path / "cal")
    res = build_report(tmp_path / "cal", tmp_path / "rep", png=False)
    page = res.html_path.read_text()
    assert "race" in res.charts and (tmp_path / "rep" / "race.html").is_file()
    assert "The race of run: eliminations over time" in page and "eliminated after pass 2" in page
    assert isinstance(race_frame(race_record), pd.DataFrame)
