"""toolkit.tables: a table read back is checked in one line naming the file, the line and the fault."""

from __future__ import annotations

import pandas as pd
import pytest

from toolkit.tables import Column, check_unique, check_values, read_csv


def test_read_csv_names_a_torn_row_a_missing_column_and_a_missing_file(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("a,b,c\n1,2,3\n4,5\n")  # pandas alone fills the torn row with NaN without a word
    with pytest.raises(ValueError, match=r"t.csv': line 3 has 2 fields, the header has 3 \(a torn or corrupt row\)"):
        read_csv(p)
    p.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="missing column"):
        read_csv(p, required=("a", "c"))
    assert list(read_csv(p, required=("a",))["b"]) == [2]
    with pytest.raises(ValueError, match="calibration table '.*nope.csv': no such file"):
        read_csv(tmp_path / "nope.csv", what="calibration table")


@pytest.mark.parametrize("value,column,needle", [
    (float("inf"), Column("x", lo=0.0, lo_open=True), "inf is not finite; valid: a finite number > 0"),
    (0.0, Column("x", lo=0.0, lo_open=True), "0.0 is out of range"),
    (2.5, Column("x", lo=0, integer=True), "2.5 is not an integer"),
    (9, Column("x", lo=-1, hi=7, integer=True), "9 is out of range; valid: an integer >= -1 and <= 7"),
    ("abc", Column("x"), "'abc' is not a number"),
    (None, Column("x"), "None is empty"),
])
def test_check_values_names_the_line_column_and_value(value, column, needle):
    frame = pd.DataFrame({"x": [1, value]}, dtype=object)
    with pytest.raises(ValueError, match="f.csv: line 3, column x: ") as e:
        check_values(frame, "f.csv", [column])
    assert needle in str(e.value)


def test_optional_columns_skip_empty_values_and_unique_keys_name_both_lines():
    check_values(pd.DataFrame({"x": [1.0, None]}), "f.csv", [Column("x", required=False), Column("absent")])
    frame = pd.DataFrame({"k": ["a", "b", "a"], "v": [1, 2, 3]})
    with pytest.raises(ValueError, match="f.csv: line 4 repeats the row of line 2 \\(k=a\\): a row written twice"):
        check_unique(frame, "f.csv", ["k"])
    check_unique(frame, "f.csv", ["k", "v"])
