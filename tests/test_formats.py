"""Dataset loaders on good files (both layouts) and on malformed ones; the processed form;
subsampling; atomic output."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from xmc.data import (Split, XMCDataset, detect_layout, load_dataset_dir, load_processed, save_processed,
                      split_validation, subsample, subsample_validation)
from xmc.data.formats import read_filter_pairs, read_json_lines, read_sparse_labels, read_text_lines
from xmc.errors import DataFormatError
from xmc.io import atomic_dir, atomic_file

REPO = Path(__file__).resolve().parents[1]
SEMCOR = REPO.parent / "shared" / "datasets" / "semcor-wn30"


# ------------------------------------------------------------------------------ helpers


def write_files(d: Path, files: dict[str, str | bytes | None]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if content is None:
            (d / name).unlink(missing_ok=True)
        elif name.endswith(".gz"):
            data = content.encode() if isinstance(content, str) else content
            (d / name).write_bytes(gzip.compress(data))
        elif isinstance(content, bytes):
            (d / name).write_bytes(content)
        else:
            (d / name).write_text(content, encoding="utf-8")
    return d


def jl(*recs: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in recs)


# XC raw layout with uid separator "->", a trn sidecar and a test filter. 4 labels, 3 train, 2 test.
XC_RAW = {
    "lbl.raw.txt": "L0->label zero\nL1->label one\nL2->label two\nL3->label three\n",
    "trn.raw.txt": "t0->first train\nt1->second train\nt2-> third train \n",
    "tst.raw.txt": "s0->first test\ns1->second test\n",
    # values are binarised; row 2 lists label 3 twice
    "trn_X_Y.txt": "3 4\n0:1 2:0.5\n1:1\n3:1 0:1 3:2\n",
    # test row 1 has no labels (an empty line)
    "tst_X_Y.txt": "2 4\n2:1\n\n",
    "filter_labels_test.txt": "0 1\n1 3\n",
    "trn.jsonl": jl({"uid": "u0", "doc": "d0", "text": "first train"},
                    {"uid": "u1", "doc": "d0", "text": "second train"},
                    {"uid": "u2", "doc": "d1"}),
}

# JSON-lines layout: 3 labels, 3 train, 2 test (gzip).
JSONL = {
    "lbl.json": jl({"uid": "A", "title": "Alpha", "content": "first letter"},
                   {"uid": "B", "title": "Beta"},
                   {"uid": "C", "title": " ", "content": "third"}),
    "trn.json": jl({"uid": "x0", "title": "T0", "content": "c0", "target_ind": [2, 0, 2], "doc": "D1"},
                   {"uid": "x1", "title": "T1", "content": "c1", "target_ind": [], "doc": "D1"})
    + "\n"  # a blank line is skipped
    + jl({"uid": "x2", "title": "T2", "content": None, "target_ind": [1], "doc": "D2"}),
    "tst.json.gz": jl({"uid": "y0", "title": "Q0", "content": "q0", "target_ind": [1]},
                      {"uid": "y1", "title": "Q1", "content": "q1", "target_ind": [0, 2]}),
}


@pytest.fixture
def xc_dir(tmp_path: Path) -> Path:
    return write_files(tmp_path / "xc", XC_RAW)


@pytest.fixture
def jsonl_dir(tmp_path: Path) -> Path:
    return write_files(tmp_path / "js", JSONL)


def dense(m: sp.spmatrix) -> list[list[float]]:
    return m.toarray().tolist()


# ----------------------------------------------------------------------- good: XC raw


def test_detect_layout(xc_dir: Path, jsonl_dir: Path, tmp_path: Path):
    assert detect_layout(xc_dir) == "xc_raw"
    assert detect_layout(jsonl_dir) == "jsonl"
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFormatError, match="no known layout") as e:
        detect_layout(tmp_path / "empty")
    assert "empty" in str(e.value)
    with pytest.raises(DataFormatError, match="dataset directory not found"):
        detect_layout(tmp_path / "missing")
    with pytest.raises(DataFormatError, match="unknown layout 'csv'"):
        load_dataset_dir(xc_dir, layout="csv")


def test_load_xc_raw_with_separator_sidecar_and_filter(xc_dir: Path):
    ds = load_dataset_dir(xc_dir, uid_separator="->")
    assert ds.meta["layout"] == "xc_raw"
    assert ds.label_uids == ["L0", "L1", "L2", "L3"]
    assert ds.label_texts == ["label zero", "label one", "label two", "label three"]
    # uids and groups from the sidecar; texts stripped
    assert ds.trn.uids == ["u0", "u1", "u2"]
    assert ds.trn.texts == ["first train", "second train", "third train"]
    assert ds.trn.groups == ["d0", "d0", "d1"]
    assert dense(ds.trn.Y) == [[1, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 1]]
    # no tst.jsonl: uids from the separator, no groups
    assert ds.tst.uids == ["s0", "s1"]
    assert ds.tst.groups is None
    assert dense(ds.tst.Y) == [[0, 0, 1, 0], [0, 0, 0, 0]]
    assert dense(ds.tst_filter) == [[0, 1, 0, 0], [0, 0, 0, 1]]
    c = ds.counts()
    assert c["trn"]["label_pairs"] == 5 and c["trn"]["groups"] == 2 and c["tst_filter_pairs"] == 2


XC_PLAIN = {"lbl.raw.txt": "alpha\nbeta\ngamma\n", "trn.raw.txt": "doc a\ndoc b\n", "trn_X_Y.txt": "2 3\n0:1\n1:1 2:1\n"}


def test_xc_raw_labels_keep_the_datasets_own_ids_from_lbl_jsonl(tmp_path: Path):
    """Without a sidecar a label is its row number; with ``lbl.jsonl`` it is the record's ``id`` (``uid`` where
    there is no ``id``), row for row, so that a prediction names the label as the dataset does."""
    assert load_dataset_dir(write_files(tmp_path / "plain", XC_PLAIN)).label_uids == ["0", "1", "2"]
    d = write_files(tmp_path / "ids", {**XC_PLAIN, "lbl.jsonl": jl({"lid": 0, "id": "00001740-a"},
                                                                   {"lid": 1, "id": "00001740-n"}, {"id": "x-3"})})
    ds = load_dataset_dir(d)
    assert ds.label_uids == ["00001740-a", "00001740-n", "x-3"] and ds.label_texts == ["alpha", "beta", "gamma"]
    d = write_files(tmp_path / "uids", {**XC_PLAIN, "lbl.jsonl": jl({"uid": "a"}, {"uid": "b"}, {"uid": 7})})
    assert load_dataset_dir(d).label_uids == ["a", "b", "7"]
    # a uid separator gives each line its own id: the sidecar does not override it
    d = write_files(tmp_path / "sep", {**XC_PLAIN, "lbl.raw.txt": "A->alpha\nB->beta\nC->gamma\n",
                                       "trn.raw.txt": "t0->doc a\nt1->doc b\n",
                                       "lbl.jsonl": jl({"id": "x"}, {"id": "y"}, {"id": "z"})})
    assert load_dataset_dir(d, uid_separator="->").label_uids == ["A", "B", "C"]


@pytest.mark.parametrize("sidecar, message", [
    (jl({"id": "a"}, {"id": "b"}), "lbl.jsonl: 2 label records but the label text file has 3 rows"),
    (jl({"id": "a"}, {"id": "b"}, {"id": "a"}), "lbl.jsonl:3: label id 'a' already given on line 1"),
    (jl({"lid": 0, "id": "a"}, {"lid": 2, "id": "b"}, {"lid": 1, "id": "c"}), "lbl.jsonl:2: lid 2 but this is label row 1"),
    (jl({"id": "a"}, {"name": "b"}, {"id": "c"}), "lbl.jsonl:2: expected a label id"),
    (jl({"id": "a"}, {"id": "  "}, {"id": "c"}), "lbl.jsonl:2: expected a label id"),
    (jl({"id": "a"}, {"id": True}, {"id": "c"}), "lbl.jsonl:2: expected a label id"),
], ids=["count", "duplicate", "order", "missing", "blank", "bool"])
def test_a_bad_label_id_sidecar_is_one_line(tmp_path: Path, sidecar: str, message: str):
    d = write_files(tmp_path / "d", {**XC_PLAIN, "lbl.jsonl": sidecar})
    with pytest.raises(DataFormatError) as e:
        load_dataset_dir(d)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_semcor_labels_are_synset_ids():
    ds = load_dataset_dir(SEMCOR)
    first = json.loads((SEMCOR / "lbl.jsonl").open(encoding="utf-8").readline())
    assert ds.label_uids[0] == first["id"] == "00001740-a" and len(set(ds.label_uids)) == ds.n_labels


def test_load_xc_raw_alternative_names_without_separator(tmp_path: Path):
    d = write_files(tmp_path / "alt", {
        "Y.txt": "alpha\nbeta\ngamma\n",
        "trn_X.txt": "doc a\ndoc b\n",
        "tst_X.txt": "doc c\r\n",  # CRLF is tolerated
        "trn_X_Y.txt": "2 3\n0:1\n1:1 2:1\n",
        "tst_X_Y.txt": "1 3\n2:1\n",
    })
    assert detect_layout(d) == "xc_raw"
    ds = load_dataset_dir(d)
    assert ds.label_uids == ["0", "1", "2"] and ds.label_texts == ["alpha", "beta", "gamma"]
    assert ds.trn.uids == ["0", "1"] and ds.trn.texts == ["doc a", "doc b"]
    assert ds.tst.texts == ["doc c"]
    assert dense(ds.trn.Y) == [[1, 0, 0], [0, 1, 1]]
    assert ds.tst_filter is None and ds.trn.groups is None


def test_read_text_lines_keeps_text_after_first_separator(tmp_path: Path):
    p = tmp_path / "x.txt"
    p.write_text(" a1 ->x->y\nb2->  z\n", encoding="utf-8")
    assert read_text_lines(p, "->") == (["a1", "b2"], ["x->y", "z"])
    # without a separator the whole line is the text and uids are row numbers
    assert read_text_lines(p) == (["0", "1"], ["a1 ->x->y", "b2->  z"])


def test_read_sparse_labels_trailing_blank_lines_and_empty_rows(tmp_path: Path):
    p = tmp_path / "y.txt"
    p.write_text("3 5\n\n4:1 4:1\n0\n\n\n", encoding="utf-8")
    Y = read_sparse_labels(p)
    assert Y.shape == (3, 5)
    assert dense(Y) == [[0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [1, 0, 0, 0, 0]]
    assert Y.data.tolist() == [1.0, 1.0]


def test_read_filter_pairs(tmp_path: Path):
    p = tmp_path / "f.txt"
    p.write_text("1 2\n\n0 0\n1 2\n", encoding="utf-8")
    M = read_filter_pairs(p, 2, 3)
    assert dense(M) == [[1, 0, 0], [0, 0, 1]]


# ------------------------------------------------------------------------ good: JSONL


def test_load_jsonl_layout(jsonl_dir: Path):
    ds = load_dataset_dir(jsonl_dir)
    assert ds.meta["layout"] == "jsonl"
    assert ds.meta["text_fields"] == ["title", "content"]
    assert ds.label_uids == ["A", "B", "C"]
    assert ds.label_texts == ["Alpha first letter", "Beta", "third"]
    assert ds.trn.uids == ["x0", "x1", "x2"]
    assert ds.trn.texts == ["T0 c0", "T1 c1", "T2"]
    assert ds.trn.groups == ["D1", "D1", "D2"]
    assert dense(ds.trn.Y) == [[1, 0, 1], [0, 0, 0], [0, 1, 0]]
    assert ds.tst.uids == ["y0", "y1"] and ds.tst.groups is None
    assert dense(ds.tst.Y) == [[0, 1, 0], [1, 0, 1]]
    assert ds.tst_filter is None


def test_load_jsonl_text_fields(jsonl_dir: Path):
    ds = load_dataset_dir(jsonl_dir, text_fields=["content", "title"])
    assert ds.label_texts == ["first letter Alpha", "Beta", "third"]
    assert ds.trn.texts == ["c0 T0", "c1 T1", "T2"]
    # title only: label C's title is blank -> empty text on line 3 of lbl.json
    with pytest.raises(DataFormatError) as e:
        load_dataset_dir(jsonl_dir, text_fields=["title"])
    assert "lbl.json:3: empty text" in str(e.value)


# -------------------------------------------------------------------------- malformed
#
# Each case: (base layout, overridden files, uid separator, file named in the error,
# "<name>:<line>: <message start>" expected in str(error)).

BAD_UTF8_TRN = b"t0->first train\nt1->bad \xff\xfe text\nt2->third train\n"

MALFORMED = {
    # --- XC raw: sparse label files
    "rows_header_more_than_file": (XC_RAW, {"trn_X_Y.txt": "5 4\n0:1\n1:1\n3:1\n"},
                                   "trn_X_Y.txt: header says 5 rows but the file has 3"),
    "rows_header_fewer_than_texts": (XC_RAW, {"trn_X_Y.txt": "2 4\n0:1\n1:1\n"},
                                     "trn_X_Y.txt:1: header says 2 rows but trn.raw.txt has 3 texts"),
    "rows_more_than_header": (XC_RAW, {"trn_X_Y.txt": "2 4\n0:1\n1:1\n3:1\n"},
                              "trn_X_Y.txt:4: more rows than the header's 2"),
    "label_id_equal_L": (XC_RAW, {"trn_X_Y.txt": "3 4\n0:1\n4:1\n3:1\n"},
                         "trn_X_Y.txt:3: label id 4 out of range [0, 4)"),
    "label_id_negative": (XC_RAW, {"tst_X_Y.txt": "2 4\n-1:1\n\n"},
                          "tst_X_Y.txt:2: label id -1 out of range [0, 4)"),
    "bad_header_word": (XC_RAW, {"trn_X_Y.txt": "3 four\n0:1\n1:1\n3:1\n"}, "trn_X_Y.txt:1: bad header"),
    "bad_header_one_field": (XC_RAW, {"trn_X_Y.txt": "3\n0:1\n1:1\n3:1\n"}, "trn_X_Y.txt:1: bad header"),
    "header_label_count": (XC_RAW, {"tst_X_Y.txt": "2 5\n2:1\n\n"},
                           "tst_X_Y.txt:1: header says 5 labels but the label file has 4"),
    "bad_token": (XC_RAW, {"trn_X_Y.txt": "3 4\n0:x\n1:1\n3:1\n"}, "trn_X_Y.txt:2: bad token '0:x'"),
    "labels_non_utf8": (XC_RAW, {"trn_X_Y.txt": b"3 4\n0:1\n1:1 \xff\xfe\n3:1\n"},
                        "trn_X_Y.txt:3: not valid UTF-8"),
    "labels_empty_file": (XC_RAW, {"trn_X_Y.txt": ""}, "trn_X_Y.txt: empty file"),
    "labels_missing": (XC_RAW, {"tst_X_Y.txt": None}, "tst_X_Y.txt: file not found"),
    # --- XC raw: text files
    "text_non_utf8": (XC_RAW, {"trn.raw.txt": BAD_UTF8_TRN}, "trn.raw.txt:2: not valid UTF-8"),
    "text_empty_file": (XC_RAW, {"tst.raw.txt": ""}, "tst.raw.txt: empty file"),
    "text_empty_line": (XC_RAW, {"trn.raw.txt": "t0->first train\nt1->   \nt2->third train\n"},
                        "trn.raw.txt:2: empty text"),
    "text_blank_line": (XC_RAW, {"lbl.raw.txt": "L0->a\nL1->b\n\nL3->d\n"}, "lbl.raw.txt:3: missing uid separator"),
    "text_missing_separator": (XC_RAW, {"lbl.raw.txt": "L0->a\nL1 b\nL2->c\nL3->d\n"},
                               "lbl.raw.txt:2: missing uid separator '->'"),
    # --- XC raw: sidecar and filter
    "sidecar_count": (XC_RAW, {"trn.jsonl": jl({"uid": "u0"}, {"uid": "u1"})},
                      "trn.jsonl: 2 records but the text file has 3 rows"),
    "sidecar_misaligned": (XC_RAW, {"trn.jsonl": jl({"uid": "u0", "text": "first train"},
                                                    {"uid": "u1", "text": "third train"},
                                                    {"uid": "u2", "text": "second train"})},
                           "trn.jsonl:2: text differs"),
    "sidecar_missing_uid": (XC_RAW, {"trn.jsonl": jl({"uid": "u0"}, {"uid": "u1"}, {"doc": "d"})},
                            "trn.jsonl:3: missing 'uid'"),
    "sidecar_invalid_json": (XC_RAW, {"trn.jsonl": '{"uid": "u0"}\n{"uid": u1}\n{"uid": "u2"}\n'},
                             "trn.jsonl:2: invalid JSON"),
    "filter_label_range": (XC_RAW, {"filter_labels_test.txt": "0 1\n1 9\n"},
                           "filter_labels_test.txt:2: label id 9 out of range [0, 4)"),
    "filter_row_range": (XC_RAW, {"filter_labels_test.txt": "2 0\n"},
                         "filter_labels_test.txt:1: row 2 out of range [0, 2)"),
    "filter_bad_line": (XC_RAW, {"filter_labels_test.txt": "0 1\n\n1\n"},
                        "filter_labels_test.txt:3: expected 'row label_id'"),
    # --- JSON lines
    "json_invalid": (JSONL, {"trn.json": '{"uid": "x0", "title": "a", "target_ind": [0]}\n{bad\n'},
                     "trn.json:2: invalid JSON"),
    "json_not_object": (JSONL, {"lbl.json": '{"title": "a"}\n[1, 2]\n'}, "lbl.json:2: expected a JSON object"),
    "json_target_out_of_range": (JSONL, {"tst.json.gz": jl({"title": "a", "target_ind": [0]},
                                                           {"title": "b", "target_ind": [1, 3]})},
                                 "tst.json.gz:2: label id 3 out of range [0, 3)"),
    "json_target_negative": (JSONL, {"trn.json": jl({"title": "a", "target_ind": [-1]})},
                             "trn.json:1: label id -1 out of range [0, 3)"),
    "json_target_not_ints": (JSONL, {"trn.json": jl({"title": "a", "target_ind": [0]},
                                                    {"title": "b", "target_ind": [1.0]})},
                             "trn.json:2: 'target_ind' must be a list of integers"),
    "json_target_bool": (JSONL, {"trn.json": jl({"title": "a", "target_ind": [True]})},
                         "trn.json:1: 'target_ind' must be a list of integers"),
    "json_target_missing": (JSONL, {"trn.json": jl({"title": "a"})}, "trn.json:1: missing 'target_ind'"),
    "json_field_not_string": (JSONL, {"trn.json": jl({"title": 5, "target_ind": []})},
                              "trn.json:1: field 'title' is not a string"),
    "json_empty_text": (JSONL, {"trn.json": jl({"title": "a", "target_ind": []}, {"title": "", "target_ind": []})},
                        "trn.json:2: empty text"),
    "json_non_utf8_gz": (JSONL, {"tst.json.gz": b'{"title": "\xff\xfe", "target_ind": []}\n'},
                         "tst.json.gz:1: not valid UTF-8"),
    "json_empty_file": (JSONL, {"lbl.json": ""}, "lbl.json: empty file"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_raises_data_format_error_with_file_and_line(case: str, tmp_path: Path):
    base, overrides, expected = MALFORMED[case]
    d = write_files(tmp_path / "bad", {**base, **overrides})
    sep = "->" if base is XC_RAW else None
    with pytest.raises(DataFormatError) as e:
        load_dataset_dir(d, uid_separator=sep)
    msg = str(e.value)
    assert expected in msg
    # the full path of the file comes first: "<dir>/<name>[:<line>]: message"
    name = expected.split(":")[0]
    assert msg.startswith(str(d / name) + ":")
    assert e.value.path == str(d / name)
    assert "\n" not in msg


def test_data_format_error_str():
    assert str(DataFormatError("a/b.txt", 7, "boom")) == "a/b.txt:7: boom"
    assert str(DataFormatError(Path("a/b.txt"), None, "boom")) == "a/b.txt: boom"


def test_blank_text_line_without_separator(tmp_path: Path):
    p = tmp_path / "trn_X.txt"
    p.write_text("a\n \t\nc\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as e:
        read_text_lines(p)
    assert str(e.value) == f"{p}:2: empty text"
    assert read_text_lines(p, allow_empty=True) == (["0", "1", "2"], ["a", "", "c"])


def test_read_json_lines_reports_column(tmp_path: Path):
    p = tmp_path / "x.json"
    p.write_text('{"a": 1}\n\n{"a": 1,}\n', encoding="utf-8")
    with pytest.raises(DataFormatError) as e:
        read_json_lines(p)
    assert str(e.value).startswith(f"{p}:3: invalid JSON (")
    assert "column" in str(e.value)


def test_corrupt_gzip_raises_data_format_error(tmp_path: Path):
    p = tmp_path / "tst.json.gz"
    p.write_bytes(b'{"title": "not gzipped"}\n')
    with pytest.raises(DataFormatError):
        read_json_lines(p)


# ------------------------------------------------------------ ingest stage: no output


def _write_params(d: Path, dataset_dir: Path, uid_sep: str | None = None) -> Path:
    """A params.yaml in ``d`` reading ``dataset_dir``; returns where ingest writes
    (``d``/results/<the dataset folder's name>/data/processed)."""
    sep = "null" if uid_sep is None else json.dumps(uid_sep)
    (d / "params.yaml").write_text(
        "data:\n"
        f"  dataset_dir: {json.dumps(str(dataset_dir))}\n"
        "  layout: auto\n"
        f"  uid_separator: {sep}\n"
        "  text_fields: [title, content]\n"
        "  subsample: {trn: 0, tst: 0, unit: documents, labels: all}\n",
        encoding="utf-8",
    )
    return d / "results" / Path(dataset_dir).name / "data" / "processed"


def _run_ingest(cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("XMC_LOG_LEVEL", None)
    return subprocess.run([sys.executable, "-m", "stages.ingest"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def test_ingest_stage_on_malformed_data_writes_nothing(tmp_path: Path):
    data = write_files(tmp_path / "raw", {**XC_RAW, "trn_X_Y.txt": "3 4\n0:1\n4:1\n3:1\n"})
    out = _write_params(tmp_path, data, "->")
    r = _run_ingest(tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error:")
    assert "trn_X_Y.txt:3: label id 4 out of range" in lines[0]
    assert not out.exists()
    # no temporary siblings either
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml", "raw"]


def test_ingest_stage_on_good_data_writes_processed_dir(tmp_path: Path, xc_dir: Path):
    out = _write_params(tmp_path, xc_dir, "->")
    r = _run_ingest(tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "columns", "label_side", "lbl.jsonl", "meta.json", "source.json", "trn.jsonl", "trn_Y.npz", "tst.jsonl", "tst_Y.npz",
        "tst_filter.npz", "val.jsonl", "val_Y.npz"]
    # an XC dataset without a label graph: the label-side folder exists (a stage can depend on it) and is empty
    assert json.loads((out / "label_side" / "manifest.json").read_text()) == {"files": []}
    assert sorted(p.name for p in (out / "columns").iterdir()) == ["lbl", "manifest.json", "trn", "tst", "val"]
    meta = json.loads((out / "meta.json").read_text())
    # one of the two training documents (d0: 2 rows, d1: 1 row) became the validation split
    assert meta["counts"]["trn"]["instances"] + meta["counts"]["val"]["instances"] == 3
    assert meta["counts"]["val"]["groups"] == 1 and meta["counts"]["n_labels"] == 4
    assert meta["validation"]["source"] == "carved from trn" and meta["validation"]["unit"] == "groups"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# --------------------------------------------------------- processed form round trip


def test_save_load_processed_round_trip(tmp_path: Path, xc_dir: Path):
    ds = split_validation(load_dataset_dir(xc_dir, uid_separator="->"), 0.5, seed=0)
    meta = save_processed(ds, tmp_path / "p")
    back = load_processed(tmp_path / "p")
    assert back.label_uids == ds.label_uids and back.label_texts == ds.label_texts
    for name in ("trn", "val", "tst"):
        a, b = ds.split(name), back.split(name)
        assert b.uids == a.uids and b.texts == a.texts and b.groups == a.groups
        assert dense(b.Y) == dense(a.Y)
        assert b.Y.shape == a.Y.shape
    assert sorted(back.trn.groups + back.val.groups) == ["d0", "d0", "d1"] and back.tst.groups is None
    assert not set(back.trn.groups) & set(back.val.groups)
    assert dense(back.tst_filter) == [[0, 1, 0, 0], [0, 0, 0, 1]]
    assert back.meta["layout"] == "xc_raw"
    assert back.meta["counts"] == meta["counts"] == ds.counts()
    # deterministic content hash; a second save over the first replaces it cleanly
    meta2 = save_processed(ds, tmp_path / "p")
    assert meta2["content_sha256"] == meta["content_sha256"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p", "xc"]


def test_the_carved_validation_split_keeps_the_training_filter_of_its_rows(tmp_path: Path):
    """``filter_labels_train.txt`` pairs (e.g. an item's own label) follow their rows into the carved validation
    split: saved as val_filter.npz, loaded with the validation split, and dropped from its ranking before scoring."""
    from xmc.evaluation import evaluate_split
    from xmc.predictions import TopK

    d = write_files(tmp_path / "xc", {**XC_RAW, "filter_labels_train.txt": "0 3\n2 1\n"})
    ds = load_dataset_dir(d, uid_separator="->")
    assert dense(ds.trn_filter) == [[0, 0, 0, 1], [0, 0, 0, 0], [0, 1, 0, 0]]
    ds = split_validation(ds, 0.5, seed=0)
    # document d1 (row 2) or d0 (rows 0, 1) became validation: its rows' pairs moved with it
    val_rows = [int(u[1]) for u in ds.val.uids]
    want = [[0, 0, 0, 1], [0, 0, 0, 0], [0, 1, 0, 0]]
    assert dense(ds.val_filter) == [want[i] for i in val_rows]
    assert dense(ds.trn_filter) == [want[int(u[1])] for u in ds.trn.uids]
    save_processed(ds, tmp_path / "p")
    back = load_processed(tmp_path / "p", splits=("trn", "val"))
    assert dense(back.val_filter) == dense(ds.val_filter) and back.counts()["val_filter_pairs"] == ds.val_filter.nnz
    # the hash of what training reads moves with the filter
    h = back.meta["content_sha256"]
    (tmp_path / "p" / "val_filter.npz").unlink()
    assert load_processed(tmp_path / "p", splits=("trn", "val")).meta["content_sha256"] != h
    # a filtered pair ranked first is dropped: the true label behind it is the first
    gold = [int(np.flatnonzero(r)[0]) if r.any() else 0 for r in back.val.Y.toarray()]
    filtered = [int(np.flatnonzero(r)[0]) if r.any() else -1 for r in back.val_filter.toarray()]
    rows = [i for i, f in enumerate(filtered) if f >= 0]
    assert rows, "the carved validation split holds a filtered pair"
    ids = np.array([[f if f >= 0 else g, g, 0] for f, g in zip(filtered, gold)], np.int32)
    top = TopK(ids, np.tile(np.array([3.0, 2.0, 1.0], np.float32), (len(gold), 1)))
    params = {"evaluate": {"ks": [1], "recall_ks": [3], "propensity_a": 0.55, "propensity_b": 1.5,
                           "bootstrap": {"n_resamples": 20}}}
    m = evaluate_split(top, back, "val", params)["metrics"]
    has_gold = back.val.Y.getnnz(axis=1) > 0
    assert m["P@1"] == pytest.approx(100.0 * has_gold.mean(), abs=1e-3)


def test_round_trip_unicode_and_partial_groups_without_filter(tmp_path: Path):
    Y = sp.csr_matrix(np.array([[1, 0], [0, 0]], np.float32))
    s = Split(["ü1", "2"], ["naïve café — 東京", 'quote " and \\ backslash'], Y, ["g", None])
    ds = XMCDataset(["a", "b"], ["ä", "b"], s, s, None, {"layout": "jsonl"}, val=s)
    save_processed(ds, tmp_path / "p")
    assert not (tmp_path / "p" / "tst_filter.npz").exists()
    back = load_processed(tmp_path / "p")
    assert back.trn.texts == s.texts and back.trn.uids == s.uids and back.trn.groups == ["g", None]
    assert back.label_texts == ["ä", "b"] and back.tst_filter is None
    assert dense(back.tst.Y) == [[1, 0], [0, 0]]


def test_load_processed_requires_its_files(tmp_path: Path):
    with pytest.raises(DataFormatError, match="missing from the processed dataset") as e:
        load_processed(tmp_path)
    assert "lbl.jsonl" in str(e.value)


def test_training_load_reads_no_test_file(tmp_path: Path, xc_dir: Path):
    """A stage that loads trn + val opens no test file: it works with the test files gone, and its
    content hash (a checkpoint fingerprint) does not move when the test split changes."""
    ds = split_validation(load_dataset_dir(xc_dir, uid_separator="->"), 0.5, seed=0)
    save_processed(ds, tmp_path / "p")
    h1 = load_processed(tmp_path / "p", splits=("trn", "val")).meta["content_sha256"]
    for f in ("tst.jsonl", "tst_Y.npz", "tst_filter.npz", "meta.json"):
        (tmp_path / "p" / f).unlink()
    back = load_processed(tmp_path / "p", splits=("trn", "val"))
    assert back.tst is None and back.tst_filter is None and len(back.val) > 0
    assert back.meta["content_sha256"] == h1
    with pytest.raises(KeyError, match="tst"):
        back.split("tst")
    with pytest.raises(DataFormatError, match="tst.jsonl"):
        load_processed(tmp_path / "p")


# ------------------------------------------------------------------ validation split


def _many_groups(n_groups: int = 40, per_group: int = 3, loose: int = 0) -> XMCDataset:
    n = n_groups * per_group + loose
    Y = sp.csr_matrix((np.ones(n, np.float32), (np.arange(n), np.arange(n) % 7)), shape=(n, 7))
    groups = [f"doc{i // per_group}" for i in range(n_groups * per_group)] + [None] * loose
    trn = Split([f"u{i}" for i in range(n)], [f"text {i}" for i in range(n)], Y, groups)
    tst = Split(["s0"], ["a test"], sp.csr_matrix(np.ones((1, 7), np.float32)))
    return XMCDataset([f"L{i}" for i in range(7)], [f"label {i}" for i in range(7)], trn, tst)


def test_split_validation_moves_whole_groups_deterministically():
    ds = _many_groups(40, 3)
    a, b, c = split_validation(ds, 0.1, seed=0), split_validation(ds, 0.1, seed=0), split_validation(ds, 0.1, seed=1)
    assert a.val.uids == b.val.uids and a.trn.uids == b.trn.uids       # deterministic for a seed
    assert a.val.uids != c.val.uids                                    # another seed, another carve-out
    assert not set(a.val.groups) & set(a.trn.groups)                   # no document on both sides
    assert len(set(a.val.groups)) == 4 and len(a.val) == 12 and len(a.trn) == 108
    assert sorted(a.val.uids + a.trn.uids, key=lambda u: int(u[1:])) == ds.trn.uids
    # rows keep their labels
    rows = {u: i for i, u in enumerate(ds.trn.uids)}
    for j, u in enumerate(a.val.uids):
        assert (a.val.Y[j] != ds.trn.Y[rows[u]]).nnz == 0
    assert a.tst is ds.tst and a.meta["validation"]["groups"] == 4


def test_split_validation_splits_ungrouped_rows_by_row():
    ds = _many_groups(10, 2, loose=30)
    v = split_validation(ds, 0.1, seed=0)
    loose_val = [g for g in v.val.groups if g is None]
    assert len(loose_val) == 3 and len({g for g in v.val.groups if g is not None}) == 1
    nogroups = XMCDataset(ds.label_uids, ds.label_texts, Split(ds.trn.uids, ds.trn.texts, ds.trn.Y), ds.tst)
    v2 = split_validation(nogroups, 0.25, seed=0)
    assert len(v2.val) == 12 and v2.val.groups is None and v2.meta["validation"]["unit"] == "rows"
    with pytest.raises(ValueError, match="fraction"):
        split_validation(ds, 1.0)
    one = XMCDataset(ds.label_uids, ds.label_texts, Split(["u"], ["t"], ds.trn.Y[:1]), ds.tst)
    with pytest.raises(ValueError, match="cannot carve"):
        split_validation(one, 0.1)


def test_a_shipped_validation_split_is_loaded_and_used(tmp_path: Path):
    files = {k: v for k, v in XC_RAW.items() if k != "trn.jsonl"}
    files.update({"val.raw.txt": "v0->a validation text\nv1->another one\n", "val_X_Y.txt": "2 4\n1:1\n0:1 3:1\n"})
    d = write_files(tmp_path / "xc", files)
    ds = load_dataset_dir(d, uid_separator="->")
    assert ds.val is not None and ds.val.uids == ["v0", "v1"] and dense(ds.val.Y) == [[0, 1, 0, 0], [1, 0, 0, 1]]
    out = _write_params(tmp_path, d, "->")
    r = _run_ingest(tmp_path)
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["validation"]["source"] == "shipped with the dataset"
    assert meta["counts"]["val"]["instances"] == 2 and meta["counts"]["trn"]["instances"] == 3
    # JSON lines: val.json next to trn.json / tst.json
    jd = write_files(tmp_path / "jl", {**JSONL, "val.json": jl({"uid": "v", "title": "val title", "target_ind": [1]})})
    jds = load_dataset_dir(jd)
    assert jds.val.uids == ["v"] and jds.val.texts == ["val title"]


# --------------------------------------------------------------------------- subsample


def _grouped_dataset() -> XMCDataset:
    # 5 labels; train: documents d0 (rows 0, 1), d1 (row 2), d2 (rows 3, 4)
    trn = Split([f"a{i}" for i in range(5)], [f"ta{i}" for i in range(5)],
                sp.csr_matrix(np.array([[1, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 1],
                                        [0, 1, 0, 0, 0], [0, 0, 0, 1, 0]], np.float32)),
                ["d0", "d0", "d1", "d2", "d2"])
    # test: documents e0 (rows 0, 1), e1 (row 2)
    tst = Split(["b0", "b1", "b2"], ["tb0", "tb1", "tb2"],
                sp.csr_matrix(np.array([[0, 0, 1, 0, 0], [0, 0, 0, 0, 1], [0, 1, 0, 0, 0]], np.float32)),
                ["e0", "e0", "e1"])
    filt = sp.csr_matrix(np.array([[0, 1, 0, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 1]], np.float32))
    return XMCDataset([f"L{i}" for i in range(5)], [f"label {i}" for i in range(5)], trn, tst, filt, {"x": 1})


def test_subsample_by_documents_is_deterministic():
    ds = _grouped_dataset()
    s = subsample(ds, n_trn=2, n_tst=1, unit="documents")
    assert s.trn.uids == ["a0", "a1", "a2"] and s.trn.groups == ["d0", "d0", "d1"]
    assert s.tst.uids == ["b0", "b1"]
    assert dense(s.tst_filter) == [[0, 1, 0, 0, 0], [0, 0, 0, 1, 0]]
    assert s.n_labels == 5
    assert s.meta == {"x": 1, "subsample": {"trn": 2, "tst": 1, "unit": "documents", "labels": "all"}}
    again = subsample(ds, n_trn=2, n_tst=1, unit="documents")
    assert again.trn.uids == s.trn.uids and dense(again.trn.Y) == dense(s.trn.Y)
    # the input is not modified
    assert len(ds.trn) == 5 and ds.tst_filter.shape == (3, 5)


def test_subsample_by_instances_and_zero_keeps_all():
    ds = _grouped_dataset()
    s = subsample(ds, n_trn=2, n_tst=0, unit="instances")
    assert s.trn.uids == ["a0", "a1"] and s.trn.groups == ["d0", "d0"]
    assert dense(s.trn.Y) == [[1, 0, 0, 0, 0], [0, 0, 1, 0, 0]]
    assert s.tst.uids == ["b0", "b1", "b2"] and s.tst_filter.shape == (3, 5)
    # more than available: everything
    assert subsample(ds, n_trn=99, unit="instances").trn.uids == ds.trn.uids
    # documents without groups falls back to instances
    flat = XMCDataset(ds.label_uids, ds.label_texts, Split(ds.trn.uids, ds.trn.texts, ds.trn.Y), ds.tst)
    assert subsample(flat, n_trn=2, unit="documents").trn.uids == ["a0", "a1"]
    with pytest.raises(ValueError, match="unit"):
        subsample(ds, n_trn=1, unit="sentences")
    with pytest.raises(ValueError, match="labels"):
        subsample(ds, n_trn=1, labels="some")


def test_subsample_labels_used_renumbers_consistently():
    ds = _grouped_dataset()
    # train instances a0, a1 use labels 0 and 2; test b0 uses label 2 -> used = [0, 2]
    s = subsample(ds, n_trn=2, n_tst=1, unit="instances", labels="used")
    assert s.label_uids == ["L0", "L2"] and s.label_texts == ["label 0", "label 2"]
    assert dense(s.trn.Y) == [[1, 0], [0, 1]]
    assert dense(s.tst.Y) == [[0, 1]]
    # filter row 0 was (b0, label 1): label 1 is dropped with the label space
    assert s.tst_filter.shape == (1, 2) and s.tst_filter.nnz == 0
    # documents: trn d0 + d1 -> labels 0, 2, 4; tst e0 -> 2, 4 -> used [0, 2, 4]
    s = subsample(ds, n_trn=2, n_tst=1, unit="documents", labels="used")
    assert s.label_uids == ["L0", "L2", "L4"]
    assert dense(s.trn.Y) == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    assert dense(s.tst.Y) == [[0, 1, 0], [0, 0, 1]]
    # filter (b0, 1) and (b1, 3): neither label survives
    assert s.tst_filter.shape == (2, 3) and s.tst_filter.nnz == 0
    # labels='used' with n = 0: every row kept; all 5 labels occur somewhere -> nothing dropped
    assert subsample(ds, labels="used").label_uids == ds.label_uids


def test_subsample_documents_interleaved_keeps_filter_aligned():
    # test groups e0, e1, e0: the first document is rows 0 and 2
    tst = Split(["b0", "b1", "b2"], ["t0", "t1", "t2"], sp.csr_matrix(np.eye(3, dtype=np.float32)), ["e0", "e1", "e0"])
    filt = sp.csr_matrix(np.eye(3, dtype=np.float32))  # (b0, 0), (b1, 1), (b2, 2)
    ds = XMCDataset(["L0", "L1", "L2"], ["a", "b", "c"], tst, tst, filt)
    s = subsample(ds, n_tst=1, unit="documents")
    assert s.tst.uids == ["b0", "b2"]
    assert dense(s.tst_filter) == [[1, 0, 0], [0, 0, 1]]


# ------------------------------------------------------------------------ atomic output


def test_atomic_dir_exception_leaves_nothing(tmp_path: Path):
    target = tmp_path / "sub" / "out"
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_dir(target) as tmp:
            (tmp / "half.txt").write_text("x")
            assert tmp.parent == target.parent and tmp.exists()
            raise RuntimeError("boom")
    assert not target.exists()
    assert list((tmp_path / "sub").iterdir()) == []


def test_atomic_dir_keeps_old_content_on_failure_and_replaces_on_success(tmp_path: Path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(KeyError):
        with atomic_dir(target) as tmp:
            (tmp / "new.txt").write_text("new")
            raise KeyError("x")
    assert [p.name for p in target.iterdir()] == ["old.txt"]
    with atomic_dir(target) as tmp:
        (tmp / "new.txt").write_text("new")
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_file_exception_leaves_nothing(tmp_path: Path):
    with pytest.raises(ValueError):
        with atomic_file(tmp_path / "f.txt") as fh:
            fh.write("partial")
            raise ValueError
    assert list(tmp_path.iterdir()) == []
    with atomic_file(tmp_path / "f.txt") as fh:
        fh.write("done")
    assert (tmp_path / "f.txt").read_text() == "done" and len(list(tmp_path.iterdir())) == 1


# ------------------------------------------------------------- the real dataset (optional)


@pytest.mark.skipif(not (SEMCOR / "trn_X_Y.txt").exists(), reason="../shared/datasets/semcor-wn30 not present")
def test_real_semcor_dataset_counts():
    ds = load_dataset_dir(SEMCOR)
    assert ds.meta["layout"] == "xc_raw"
    assert (len(ds.trn), len(ds.tst), ds.n_labels) == (15790, 2097, 25819)
    assert ds.trn.Y.shape == (15790, 25819) and ds.tst.Y.shape == (2097, 25819)
    assert ds.trn.groups is not None and len(ds.trn.groups) == 15790


def test_subsample_validation_caps_only_the_validation_split():
    ds = split_validation(_grouped_dataset(), 0.5, seed=0)   # two of the three training documents move to val
    assert len({g for g in ds.val.groups}) == 2
    first_doc = ds.val.groups[0]
    s = subsample_validation(ds, 1, "documents")
    assert set(s.val.groups) == {first_doc} and s.val.uids == [u for u, g in zip(ds.val.uids, ds.val.groups)
                                                               if g == first_doc]
    kept = [i for i, g in enumerate(ds.val.groups) if g == first_doc]
    assert dense(s.val.Y) == dense(ds.val.Y[kept])
    # the training and test splits are the very same objects: a capped validation split changes nothing else
    assert s.trn is ds.trn and s.tst is ds.tst
    assert s.meta["validation"]["instances"] == len(s.val) < s.meta["validation"]["instances_before_subsample"]
    assert s.meta["validation"]["subsample"] == {"first": 1, "unit": "documents"}
    assert s.meta["validation"]["groups"] == 1 and s.meta["validation"]["groups_before_subsample"] == 2
    assert subsample_validation(ds, 0) is ds and subsample_validation(ds, 99).val.uids == ds.val.uids
    assert subsample_validation(ds, 1, "instances").val.uids == ds.val.uids[:1]


def test_large_json_files_parse_the_same_with_or_without_orjson(tmp_path, monkeypatch):
    """Large files go through orjson first; what it refuses (a huge int, NaN, a malformed line) still parses as
    json does, or fails with json's line number."""
    import math

    import xmc.io as io
    from xmc.errors import DataFormatError

    monkeypatch.setattr(io, "_LARGE_JSON", 10)
    f = tmp_path / "v.json"
    obj = {"a b": 1, "ü": [1.5, None, True], "n": 2**70}
    f.write_text(json.dumps(obj))
    assert io.read_json_file(f) == obj
    f.write_text('{"x": NaN}')
    assert math.isnan(io.read_json_file(f)["x"])
    f.write_text('{"x": 1,\n "y": }')
    with pytest.raises(DataFormatError, match=r"v\.json:2: malformed JSON"):
        io.read_json_file(f)


def test_xc_raw_rows_written_as_uid_colon_text_align_with_a_sidecar_holding_the_text_alone(tmp_path):
    """debian-relations' raw rows are "<package>: <synopsis>" and its trn.jsonl holds the synopsis alone: the two
    align (documents read from the sidecar); a row that is neither is still refused as misaligned."""
    d = tmp_path / "pkgs"
    d.mkdir()
    (d / "lbl.raw.txt").write_text("libfoo1: foo runtime\nlibbar1: bar runtime\n")
    (d / "trn.raw.txt").write_text("foo-utils: tools for foo\nbar-utils: tools for bar\n")
    (d / "trn_X_Y.txt").write_text("2 2\n0:1\n1:1\n")
    (d / "trn.jsonl").write_text(jl({"uid": "foo-utils", "doc": "foo", "text": "tools for foo"},
                                    {"uid": "bar-utils", "doc": "bar", "text": "tools for bar"}))
    ds = load_dataset_dir(d)
    assert ds.trn.texts == ["foo-utils: tools for foo", "bar-utils: tools for bar"]
    assert list(ds.trn.groups) == ["foo", "bar"] and list(ds.trn.uids) == ["foo-utils", "bar-utils"]
    (d / "trn.jsonl").write_text(jl({"uid": "foo-utils", "doc": "foo", "text": "tools for foo"},
                                    {"uid": "other", "doc": "bar", "text": "tools for bar"}))
    with pytest.raises(DataFormatError, match="misaligned"):
        load_dataset_dir(d)


def test_an_open_label_space_appends_the_catalogue_labels_the_dataset_lacks(tmp_path):
    import scipy.sparse as sp

    from xmc.data.dataset import Split, XMCDataset
    from xmc.data.open_labels import open_label_space
    from xmc.errors import DataFormatError

    d = tmp_path / "data"
    d.mkdir()
    (d / "lbl.jsonl").write_text('{"lid": 0, "id": "s1"}\n{"lid": 1, "id": "s2"}\n')
    cat = tmp_path / "synsets.jsonl"
    cat.write_text('{"id": "s2", "lemmas": ["b"], "pos": "n", "definition": "bee"}\n'
                   '{"id": "s3", "lemmas": ["c", "cee"], "pos": "v", "definition": "to see"}\n'
                   '{"id": "s4", "text": "d: a label with a text"}\n')
    Y = sp.csr_matrix([[1, 0], [0, 1]], dtype="float32")
    ds = XMCDataset(["0", "1"], ["a (n): ay", "b (n): bee"], Split(["i", "j"], ["x", "y"], Y),
                    Split(["t"], ["z"], Y[:1]), tst_filter=sp.csr_matrix((1, 2), dtype="float32"))
    out = open_label_space(ds, d, cat)
    # the dataset's own labels keep their ids; the catalogue's new ones follow, their text written as WordNet's
    assert list(out.label_uids) == ["0", "1", "s3", "s4"]
    assert list(out.label_texts)[2:] == ["c, cee (v): to see", "d: a label with a text"]
    assert out.trn.Y.shape == (2, 4) and out.tst.Y.shape == (1, 4) and out.tst_filter.shape == (1, 4)
    assert (out.trn.Y[:, :2] != Y).nnz == 0 and out.meta["open_labels"]["added"] == 2
    cat.write_text('{"id": "s3", "lemmas": ["c"], "pos": "v", "definition": "to see"}\n{"id": "s5"}\n')
    with pytest.raises(DataFormatError, match=r"synsets.jsonl:2: expected a 'text'"):
        open_label_space(ds, d, cat)
