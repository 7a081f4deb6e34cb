"""Malformed input the dataset readers used to accept silently (an independent tester's probes), each refused
with one ``path:line: message`` error, in both layouts and through the ingest stage:

1. a sparse label row cut mid-token (``12:1.0 3``, ``12:``, ``12:1.``);
2. a label id that is not plain ASCII decimal digits (``2_28`` read as 228, ``+5``, ``٣``, ``0x1f``), and JSON
   label rows that are not integers;
3. a relevance value that is not a finite number > 0 (``nan``, ``inf``, negative, zero);
4. a UTF-8 byte order mark opening a file: accepted, and never part of the first text, uid or header;
5. a key given twice in a JSON-lines record;
6. ``\\u0000`` or a lone surrogate in a JSON string, and a raw NUL byte in a text file.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stages import ingest as ingest_stage
from tests.test_formats import _write_params
from xmc.config import EXIT_INPUT_ERROR, run_entry_point
from xmc.data.formats import load_dataset_dir
from xmc.errors import DataFormatError

REPO = Path(__file__).resolve().parents[1]
BOM = "\ufeff"
N_LABELS = 300   # enough labels that "2_28" read as 228 would be in range (the old reader took it silently)

# XC raw layout: 300 labels, 4 training rows, 2 test rows.
XC = {
    "lbl.raw.txt": "".join(f"label number {i}\n" for i in range(N_LABELS)),
    "trn.raw.txt": "first train\nsecond train\nthird train\nfourth train\n",
    "trn_X_Y.txt": f"4 {N_LABELS}\n0:1.0 2:1.0\n1:1.0\n3:1.0 0:1.0\n2:1.0\n",
    "tst.raw.txt": "first test\nsecond test\n",
    "tst_X_Y.txt": f"2 {N_LABELS}\n1:1.0\n0:1.0\n",
}


def jl(*recs: dict | str) -> str:
    """JSON lines; a str record is written as given (a duplicate key cannot be written with json.dumps)."""
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs)


# JSON-lines layout: 3 labels, 3 training records.
JSONL = {
    "lbl.json": jl({"uid": "A", "title": "alpha"}, {"uid": "B", "title": "beta"}, {"uid": "C", "title": "gamma"}),
    "trn.json": jl({"uid": "x0", "title": "t0", "content": "c0", "target_ind": [0, 2]},
                   {"uid": "x1", "title": "t1", "content": "c1", "target_ind": [1]},
                   {"uid": "x2", "title": "t2", "target_ind": [2]}),
}


def write_files(d: Path, files: dict[str, str | bytes]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        data = content.encode("utf-8") if isinstance(content, str) else content
        (d / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return d


def refusal(d: Path, **kwargs: object) -> DataFormatError:
    with pytest.raises(DataFormatError) as e:
        load_dataset_dir(d, **kwargs)
    return e.value


def assert_one_line(e: DataFormatError, path: Path, line: int | None, *fragments: str) -> None:
    """The error names ``path`` and ``line`` (``path:line: message``), on one line, with every fragment."""
    msg = str(e)
    assert "\n" not in msg and "\r" not in msg, msg
    assert (e.path, e.line) == (str(path), line), msg
    assert msg.startswith(f"{path}:{line}: " if line is not None else f"{path}: "), msg
    for frag in fragments:
        assert frag in msg, (frag, msg)


# ------------------------------------------------------------------------------ 1-3. sparse label rows

# (body of trn_X_Y.txt after the header, the bad line, a fragment of the message)
LABEL_ROWS = {
    # 1. a row cut mid-token: the last line of a truncated file (no newline), or anywhere
    "truncated_after_id": ("0:1.0 2:1.0\n1:1.0\n3:1.0 0:1.0\n2:1.0 3", 5, "bad token '3'"),
    "truncated_mid_row": ("0:1.0 2:1.0\n12:1.0 3 5:1.0\n3:1.0\n2:1.0\n", 3, "bad token '3'"),
    "truncated_after_colon": ("0:1.0 2:1.0\n1:\n3:1.0\n2:1.0\n", 3, "bad token '1:'"),
    "truncated_after_point": ("0:1.0 2:1.0\n1:1.0\n3:1.\n2:1.0\n", 4, "bad token '3:1.'"),
    "truncated_exponent": ("0:1.0 2:1e\n1:1.0\n3:1.0\n2:1.0\n", 2, "bad token '2:1e'"),
    "two_colons": ("0:1.0\n1:1:1\n3:1.0\n2:1.0\n", 3, "bad token '1:1:1'"),
    # 2. a label id is 1-12 plain ASCII digits
    "underscore_id": ("0:1.0\n2_28:1.0\n3:1.0\n2:1.0\n", 3, "bad token '2_28:1.0': a label id is 1-12 ASCII digits"),
    "plus_sign_id": ("0:1.0\n1:1.0\n+5:1.0\n2:1.0\n", 4, "ASCII digits"),
    "arabic_indic_digit_id": ("0:1.0\n1:1.0\n3:1.0\n\u0663:1.0\n", 5, "ASCII digits"),
    "fullwidth_digit_id": ("0:1.0\n\uff15:1.0\n3:1.0\n2:1.0\n", 3, "ASCII digits"),
    "hex_id": ("0:1.0\n0x1f:1.0\n3:1.0\n2:1.0\n", 3, "ASCII digits"),
    "thirteen_digit_id": ("0:1.0\n1234567890123:1.0\n3:1.0\n2:1.0\n", 3, "ASCII digits"),
    "non_ascii_space": ("0:1.0\n1:1.0\u00a02:1.0\n3:1.0\n2:1.0\n", 3, "ASCII spaces"),
    # 3. a relevance value is a finite number > 0
    "nan_value": ("0:1.0\n1:nan\n3:1.0\n2:1.0\n", 3, "bad token '1:nan': a relevance value is a finite number > 0"),
    "NaN_value": ("0:1.0\n1:1.0\n3:NaN\n2:1.0\n", 4, "finite number > 0"),
    "inf_value": ("0:1.0\n1:inf\n3:1.0\n2:1.0\n", 3, "finite number > 0"),
    "minus_inf_value": ("0:-inf\n1:1.0\n3:1.0\n2:1.0\n", 2, "finite number > 0"),
    "overflowing_value": ("0:1.0\n1:1e400\n3:1.0\n2:1.0\n", 3, "bad token '1:1e400': a relevance value"),
    "negative_value": ("0:1.0\n1:1.0 2:-1\n3:1.0\n2:1.0\n", 3, "bad token '2:-1': a relevance value"),
    "zero_value": ("0:1.0\n1:1.0\n3:1.0\n2:0\n", 5, "bad token '2:0': a relevance value"),
    "zero_point_zero_value": ("0:1.0\n1:0.0\n3:1.0\n2:1.0\n", 3, "bad token '1:0.0': a relevance value"),
}


@pytest.mark.parametrize("case", sorted(LABEL_ROWS))
def test_a_bad_sparse_label_row_is_one_line_naming_file_and_line(tmp_path: Path, case: str):
    body, line, fragment = LABEL_ROWS[case]
    d = write_files(tmp_path / "ds", {**XC, "trn_X_Y.txt": f"4 {N_LABELS}\n{body}"})
    assert_one_line(refusal(d), d / "trn_X_Y.txt", line, fragment)


def test_a_bad_test_label_row_names_the_test_file(tmp_path: Path):
    d = write_files(tmp_path / "ds", {**XC, "tst_X_Y.txt": f"2 {N_LABELS}\n1:1.0\n0:1.0 1\n"})
    assert_one_line(refusal(d), d / "tst_X_Y.txt", 3, "bad token '1'", "truncated")


def test_the_first_bad_line_is_the_one_reported(tmp_path: Path):
    """An out-of-range id on line 2 comes before a value of 0 on line 3 and a cut token on line 4."""
    d = write_files(tmp_path / "ds", {**XC, "trn_X_Y.txt": f"4 {N_LABELS}\n{N_LABELS}:1\n1:0\n3:\n2:1\n"})
    assert_one_line(refusal(d), d / "trn_X_Y.txt", 2, f"label id {N_LABELS} out of range [0, {N_LABELS})")


def test_good_label_rows_still_load(tmp_path: Path):
    """Value forms a writer may use, bare label-id rows, empty rows, tabs and trailing blank lines all stay good."""
    rows = "0:1 2:0.5\n 1:.5\t3:2e-3 \n\n299:1E+2 299:1\n"
    d = write_files(tmp_path / "ds", {**XC, "trn_X_Y.txt": f"4 {N_LABELS}\n{rows}\n\n",
                                      "tst_X_Y.txt": f"2 {N_LABELS}\n0 7\n\n"})
    ds = load_dataset_dir(d)
    assert [sorted(ds.trn.Y[i].indices.tolist()) for i in range(4)] == [[0, 2], [1, 3], [], [299]]
    assert ds.trn.Y.data.tolist() == [1.0] * 5
    assert [sorted(ds.tst.Y[i].indices.tolist()) for i in range(2)] == [[0, 7], []]


# ------------------------------------------------------------------------------ 2. JSON label rows and ids

JSON_FIELDS = {
    # (the second training record, a fragment of the message)
    "target_underscore_string": ({"uid": "x1", "title": "t", "target_ind": ["2_28"]}, "got \"2_28\""),
    "target_float": ({"uid": "x1", "title": "t", "target_ind": [0, 3.7]}, "got 3.7"),
    "target_integral_float": ({"uid": "x1", "title": "t", "target_ind": [1.0]}, "got 1.0"),
    "target_bool": ({"uid": "x1", "title": "t", "target_ind": [True]}, "got true"),
    "target_null": ({"uid": "x1", "title": "t", "target_ind": [None]}, "got null"),
    "target_not_a_list": ({"uid": "x1", "title": "t", "target_ind": 1}, "must be a list of integers, not int"),
    "target_negative": ({"uid": "x1", "title": "t", "target_ind": [-1]}, "label id -1 out of range [0, 3)"),
    "uid_list": ({"uid": ["x1"], "title": "t", "target_ind": [1]}, "'uid' must be a string or an integer, not list"),
    "uid_float": ({"uid": 1.5, "title": "t", "target_ind": [1]}, "'uid' must be a string or an integer, not float"),
    "uid_bool": ({"uid": False, "title": "t", "target_ind": [1]}, "'uid' must be a string or an integer, not bool"),
    "doc_object": ({"uid": "x1", "title": "t", "target_ind": [1], "doc": {"id": 1}}, "'doc' must be a string"),
}


@pytest.mark.parametrize("case", sorted(JSON_FIELDS))
def test_a_json_record_with_a_bad_label_row_or_id_is_one_line(tmp_path: Path, case: str):
    rec, fragment = JSON_FIELDS[case]
    d = write_files(tmp_path / "ds", {**JSONL, "trn.json": jl({"uid": "x0", "title": "t0", "target_ind": [0]}, rec)})
    assert_one_line(refusal(d), d / "trn.json", 2, fragment)


# ------------------------------------------------------------------------------ 4. byte order marks


def test_a_bom_opening_raw_text_files_is_dropped(tmp_path: Path):
    names = ("trn.raw.txt", "lbl.raw.txt", "trn_X_Y.txt", "tst.raw.txt")
    d = write_files(tmp_path / "ds", {**XC, **{name: BOM + XC[name] for name in names}})
    ds = load_dataset_dir(d)
    assert ds.trn.texts[0] == "first train" and ds.tst.texts[0] == "first test"
    assert ds.label_texts[0] == "label number 0"
    assert ds.trn.Y.shape == (4, N_LABELS)
    assert not any(BOM in t for t in [*ds.trn.texts, *ds.tst.texts, *ds.label_texts])


def test_a_bom_is_not_part_of_the_first_uid(tmp_path: Path):
    d = write_files(tmp_path / "ds", {
        **XC, "lbl.raw.txt": BOM + "".join(f"L{i}->label {i}\n" for i in range(N_LABELS)),
        "trn.raw.txt": BOM + "t0->first\nt1->second\nt2->third\nt3->fourth\n", "tst.raw.txt": "s0->a\ns1->b\n",
        "trn.jsonl": BOM + jl(*({"uid": f"u{i}", "doc": f"d{i % 2}"} for i in range(4)))})
    ds = load_dataset_dir(d, uid_separator="->")
    assert ds.label_uids[0] == "L0" and ds.trn.uids[0] == "u0" and ds.trn.texts[0] == "first"


def test_a_bom_opening_json_lines_files_is_dropped(tmp_path: Path):
    """json.loads refused a BOM as invalid JSON; a Windows editor writes one: it is accepted and dropped."""
    d = write_files(tmp_path / "ds", {"lbl.json": BOM + JSONL["lbl.json"], "trn.json": BOM + JSONL["trn.json"],
                                      "tst.json.gz": BOM + jl({"uid": "y0", "title": "q0", "target_ind": [1]})})
    ds = load_dataset_dir(d)
    assert ds.label_uids[0] == "A" and ds.label_texts[0] == "alpha"
    assert ds.trn.uids[0] == "x0" and ds.trn.texts[0] == "t0 c0" and ds.tst.uids == ["y0"]


def test_a_bom_later_in_a_file_is_text(tmp_path: Path):
    """Only the first line's encoding marker is dropped: U+FEFF elsewhere is a character of the text."""
    d = write_files(tmp_path / "ds", {**XC, "trn.raw.txt": "first train\nsecond\ufefftrain\nthird\nfourth\n"})
    assert load_dataset_dir(d).trn.texts[1] == "second\ufefftrain"


# ------------------------------------------------------------------------------ 5. duplicate JSON keys

DUPLICATE_KEYS = {
    # (file, its records, the bad line, the key)
    "target_ind_twice": ("trn.json", ['{"uid": "x0", "title": "t", "target_ind": [0]}',
                                      '{"uid": "x1", "title": "t", "target_ind": [0], "target_ind": [1]}'],
                         2, "target_ind"),
    "uid_twice_spaced_colons": ("trn.json", ['{"uid" : "x0", "title" : "t", "uid" : "x9", "target_ind" : [0]}'],
                                1, "uid"),
    "title_twice_colons_in_text": ("trn.json", ['{"uid": "x0", "title": "a: b", "title": "c: d", "target_ind": [0]}'],
                                   1, "title"),
    "nested_object": ("trn.json", ['{"uid": "x0", "title": "t", "target_ind": [0], "meta": {"k": 1, "k": 2}}'], 1, "k"),
    "label_title_twice": ("lbl.json", ['{"uid": "A", "title": "alpha"}', '{"uid": "B", "title": "b", "title": "beta"}',
                                       '{"uid": "C", "title": "gamma"}'], 2, "title"),
}


@pytest.mark.parametrize("case", sorted(DUPLICATE_KEYS))
def test_a_duplicate_json_key_is_one_line_naming_the_key(tmp_path: Path, case: str):
    name, recs, line, key = DUPLICATE_KEYS[case]
    d = write_files(tmp_path / "ds", {**JSONL, name: jl(*recs)})
    assert_one_line(refusal(d), d / name, line, f"duplicate key {key!r}")


def test_a_duplicate_key_in_the_raw_layouts_sidecar(tmp_path: Path):
    side = jl({"uid": "u0", "doc": "d0"}, {"uid": "u1", "doc": "d0"}, '{"uid": "u2", "doc": "d1", "doc": "d2"}',
              {"uid": "u3", "doc": "d1"})
    d = write_files(tmp_path / "ds", {**XC, "trn.jsonl": side})
    assert_one_line(refusal(d), d / "trn.jsonl", 3, "duplicate key 'doc'")


# ------------------------------------------------------------------------------ 6. NUL and lone surrogates

NOT_TEXT = {
    # (file, its records (json.dumps escapes NUL and surrogates as \u0000 / \ud800), the bad line, a fragment)
    "nul_in_title": ("trn.json", [{"uid": "x0", "title": "t", "target_ind": [0]},
                                  {"uid": "x1", "title": "a\x00b", "target_ind": [0]}], 2, "\\u0000"),
    "lone_high_surrogate": ("trn.json", [{"uid": "x0", "title": "t", "content": "x\ud800", "target_ind": [0]}], 1,
                            "lone surrogate (\\ud800)"),
    "lone_low_surrogate_in_uid": ("trn.json", [{"uid": "\udc00", "title": "t", "target_ind": [0]}], 1,
                                  "lone surrogate (\\udc00)"),
    "surrogate_in_a_key": ("trn.json", [{"uid": "x0", "title": "t", "target_ind": [0], "\udfff": 1}], 1,
                           "lone surrogate"),
    "nul_in_a_label": ("lbl.json", [{"uid": "A", "title": "al\x00pha"}, {"uid": "B", "title": "b"},
                                    {"uid": "C", "title": "c"}], 1, "\\u0000"),
}


@pytest.mark.parametrize("case", sorted(NOT_TEXT))
def test_a_nul_or_lone_surrogate_in_a_json_string_is_one_line(tmp_path: Path, case: str):
    name, recs, line, fragment = NOT_TEXT[case]
    d = write_files(tmp_path / "ds", {**JSONL, name: jl(*recs)})
    assert_one_line(refusal(d), d / name, line, "not text", fragment)


def test_a_nul_escape_in_the_raw_layouts_sidecar(tmp_path: Path):
    d = write_files(tmp_path / "ds", {**XC, "trn.jsonl": jl(*({"uid": f"u{i}", "doc": "d\x00" if i == 1 else "d"}
                                                                for i in range(4)))})
    assert_one_line(refusal(d), d / "trn.jsonl", 2, "NUL", "not text")


@pytest.mark.parametrize("name, line", [("trn.raw.txt", 3), ("lbl.raw.txt", 1)])
def test_a_raw_nul_byte_in_a_text_file_is_one_line(tmp_path: Path, name: str, line: int):
    lines = XC[name].splitlines(keepends=True)
    lines[line - 1] = lines[line - 1].replace(" ", "\x00", 1)
    d = write_files(tmp_path / "ds", {**XC, name: "".join(lines)})
    assert_one_line(refusal(d), d / name, line, "NUL byte")


def test_strict_json_refuses_no_good_record(tmp_path: Path):
    """What the cheap checks must let through: escaped quotes and colons in strings, a surrogate pair (an emoji
    written with ensure_ascii), the text "\\u0000" (an escaped backslash), distinct keys in nested objects,
    spaces around colons."""
    trn = jl({"uid": "x0", "title": 'say "hi": now', "target_ind": [0], "meta": {"a": 1, "b": {"a": 2}}},
             {"uid": "x1", "title": "emoji \U0001f600", "content": "a \\u0000 b", "target_ind": [1]},
             '{"uid" : "x2" , "title" :"k: v", "target_ind" : [2], "extra": [{"a": 1}, {"a": 2}]}')
    ds = load_dataset_dir(write_files(tmp_path / "ds", {**JSONL, "trn.json": trn}))
    assert ds.trn.texts == ['say "hi": now', "emoji \U0001f600 a \\u0000 b", "k: v"]
    assert ds.trn.uids == ["x0", "x1", "x2"]


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_json_number_that_is_no_finite_number_is_one_line(tmp_path: Path, value: str):
    rec = '{"uid": "x0", "title": "t", "target_ind": [0], "score": ' + value + "}"
    d = write_files(tmp_path / "ds", {**JSONL, "trn.json": jl(rec)})
    assert_one_line(refusal(d), d / "trn.json", 1, "invalid JSON", value)


# ------------------------------------------------------------------------------ through the ingest stage


def _ingest_in_process(cwd: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """(exit code, stderr) of ``python -m stages.ingest`` in ``cwd``, run in-process (the same error mapping)."""
    saved_cwd, saved_env = os.getcwd(), dict(os.environ)
    capsys.readouterr()
    code = 0
    try:
        os.chdir(cwd)
        run_entry_point(ingest_stage.main)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return code, capsys.readouterr().err


STAGE_CASES = {
    # one probe of each family: (files over the base layout, the file, its line, a fragment)
    "truncated_row": (XC, {"trn_X_Y.txt": XC["trn_X_Y.txt"].replace("\n2:1.0\n", "\n2:1.0 1")}, "trn_X_Y.txt", 5,
                      "bad token '1'"),
    "underscore_id": (XC, {"trn_X_Y.txt": XC["trn_X_Y.txt"].replace("1:1.0\n", "2_28:1.0\n")}, "trn_X_Y.txt", 3,
                      "ASCII digits"),
    "nan_value": (XC, {"tst_X_Y.txt": XC["tst_X_Y.txt"].replace("0:1.0", "0:nan")}, "tst_X_Y.txt", 3,
                  "finite number > 0"),
    "duplicate_key": (JSONL, {"trn.json": JSONL["trn.json"].replace('"title": "t1"', '"title": "t1", "title": "t9"')},
                      "trn.json", 2, "duplicate key 'title'"),
    "nul_escape": (JSONL, {"lbl.json": JSONL["lbl.json"].replace("gamma", "gam\\u0000ma")}, "lbl.json", 3, "\\u0000"),
    "raw_nul_byte": (XC, {"tst.raw.txt": "first test\nsecond\x00test\n"}, "tst.raw.txt", 2, "NUL byte"),
}


@pytest.mark.parametrize("case", sorted(STAGE_CASES))
def test_the_ingest_stage_refuses_each_family_with_one_error_line(tmp_path: Path, capsys, case: str):
    base, files, name, line, fragment = STAGE_CASES[case]
    data = write_files(tmp_path / "raw", {**base, **files})
    out = _write_params(tmp_path, data)
    code, err = _ingest_in_process(tmp_path, capsys)
    errors = [x for x in err.splitlines() if x.startswith("error:")]
    assert code == EXIT_INPUT_ERROR and len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith(f"error: {data / name}:{line}: ") and fragment in errors[0], errors[0]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml", "raw"]


def test_the_ingest_stage_writes_no_bom_into_the_processed_texts(tmp_path: Path, capsys):
    data = write_files(tmp_path / "raw", {**XC, **{name: BOM + XC[name] for name in ("trn.raw.txt", "lbl.raw.txt",
                                                                                      "trn_X_Y.txt")}})
    out = _write_params(tmp_path, data)
    code, err = _ingest_in_process(tmp_path, capsys)
    assert code == 0, err
    texts = [json.loads(x)["text"] for f in ("trn.jsonl", "val.jsonl", "lbl.jsonl")
             for x in (out / f).read_text(encoding="utf-8").splitlines()]
    assert "first train" in texts and "label number 0" in texts and not any(BOM in t for t in texts)


def test_python_m_stages_ingest_on_a_truncated_label_file_writes_nothing(tmp_path: Path):
    """The real command line, once: exit code 2, one ``error:`` line naming the file and line, no output."""
    data = write_files(tmp_path / "raw", {**XC, "trn_X_Y.txt": XC["trn_X_Y.txt"].rstrip("\n") + " 3"})
    out = _write_params(tmp_path, data)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("XMC_LOG_LEVEL", None)
    r = subprocess.run([sys.executable, "-m", "stages.ingest"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == EXIT_INPUT_ERROR, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {data / 'trn_X_Y.txt'}:5: bad token '3'"), r.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml", "raw"]
