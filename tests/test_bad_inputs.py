"""Bad input of every kind a user can cause: each gives one ``error:`` line naming the file and line (or the
params key), a non-zero exit code, and leaves the outputs of the last good run byte-identical.

The stages run in-process through :func:`xmc.config.run_entry_point` (the same code path as ``python -m``:
argument handling, error mapping, exit codes), in a scratch repository holding the project's dvc.yaml and
params.yaml and a small dataset written here.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import importlib
import io
import json
import os
import pickle
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.pipeline_repo import ROOT, write_xc_dataset, results_of
from xmc.config import EXIT_INPUT_ERROR, run_entry_point

LABELS = [f"label number {i} about topic {i % 5}" for i in range(12)]
TRN = [f"training text {i} on topic {i % 5} with words w{i}" for i in range(24)]
TST = [f"test text {i} on topic {i % 5}" for i in range(6)]
TRN_ROWS = [f"{i % 12}:1.0 {(i + 3) % 12}:1.0" for i in range(24)]
TST_ROWS = [f"{i % 12}:1.0" for i in range(6)]
# the pipeline's outputs of the dataset (results/<data.name>/: the stages run with this checkout's data.name)
RES = f"results/{yaml.safe_load((ROOT / 'params.yaml').read_text())['data']['name']}"
OUTPUT_DIRS = ("results", "batch/out")


def write_dataset(d: Path) -> Path:
    return write_xc_dataset(d, LABELS, TRN, TST, TRN_ROWS, TST_ROWS)


def run_stage(module: str, argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """(exit code, stderr) of ``python -m <module> <argv>``, run in-process."""
    mod = importlib.import_module(module)
    saved_argv, saved_cwd, saved_env = sys.argv, os.getcwd(), dict(os.environ)
    sys.argv = [module, *argv]
    os.chdir(cwd)
    os.environ.update(env or {})
    err = io.StringIO()
    code = 0
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            run_entry_point(mod.main)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return code, err.getvalue()


def snapshot(repo: Path) -> dict[str, str]:
    out = {}
    for d in OUTPUT_DIRS:
        for p in sorted((repo / d).rglob("*")) if (repo / d).exists() else []:
            if p.is_file() and not p.is_symlink():
                out[str(p.relative_to(repo))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A scratch repository after one good run: data/processed, data/tfidf, a model package and its index."""
    r = tmp_path_factory.mktemp("badin")
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy2(ROOT / name, r / name)
    good = write_dataset(r.parent / f"{r.name}_dataset")
    text = (r / "params.yaml").read_text()
    text = text.replace("dataset_dir: ../shared/datasets/semcor-wn30", f"dataset_dir: {good}")
    text = text.replace("    fraction: 0.1 ", "    fraction: 0.25")
    (r / "params.yaml").write_text(text)
    (r / "params.good.yaml").write_text(text)
    code, err = run_stage("stages.ingest", [], r)
    assert code == 0, err
    code, err = run_stage("stages.tfidf", [], r)
    assert code == 0, err
    # a model package (bag-of-words encoder, its label index, labels and manifest) built as the pipeline does
    from tests.package_fixtures import trained_bow
    from xmc.data import load_processed
    from xmc.package import build_package

    ds = load_processed(results_of(r) / "data/processed", splits=("trn", "val"))
    enc = trained_bow(ds.label_texts + ds.trn.texts, dim=16, n_buckets=4096, ngram_max=1, seed=0)
    enc.save(results_of(r) / "models/tiny")
    build_package(results_of(r) / "packages/tiny", name="tiny", method="dexml", source=results_of(r) / "models/tiny", label_uids=ds.label_uids,
                  label_texts=ds.label_texts, options={"index": {"kind": "exact"}}, repo=r)
    (r / "batch").mkdir()
    (r / "batch/in.txt").write_text("a query about topic 1\nanother query\n")
    code, err = run_stage("xmc.cli", PREDICT_ARGS, r)
    assert code == 0, err
    return r


PREDICT_ARGS = ["predict", f"{RES}/packages/tiny", "--input", "batch/in.txt", "--output", "batch/out/pred.jsonl", "-k", "3"]


# ------------------------------------------------------------------------------------------------
# 1. dataset files (the ingest stage)
def _replace_line(name: str, n: int, new: bytes) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        lines = (d / name).read_bytes().split(b"\n")
        lines[n - 1] = new
        (d / name).write_bytes(b"\n".join(lines))
    return edit


def _append(name: str, data: bytes) -> Callable[[Path], None]:
    return lambda d: (d / name).write_bytes((d / name).read_bytes() + data)


def _to_jsonl(d: Path, edit: Callable[[list[dict], list[dict]], None] | None = None) -> None:
    """Rewrite the dataset in the JSON-lines layout (trn.json, tst.json, lbl.json), then apply ``edit``."""
    for f in list(d.iterdir()):
        f.unlink()
    lbl = [{"uid": f"l{i}", "title": t} for i, t in enumerate(LABELS)]
    trn = [{"uid": f"t{i}", "title": t, "target_ind": [i % 12, (i + 3) % 12]} for i, t in enumerate(TRN)]
    if edit:
        edit(lbl, trn)
    for name, recs in (("lbl", lbl), ("trn", trn),
                       ("tst", [{"uid": f"s{i}", "title": t, "target_ind": [i % 12]} for i, t in enumerate(TST)])):
        (d / f"{name}.json").write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs))


def _jsonl_record(i: int, value) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        def change(lbl, trn):
            trn[i] = value
        _to_jsonl(d, change)
    return edit


def _symlink_dev_zero(d: Path) -> None:
    (d / "trn.raw.txt").unlink()
    (d / "trn.raw.txt").symlink_to("/dev/zero")


def _directory_instead(d: Path) -> None:
    (d / "tst.raw.txt").unlink()
    (d / "tst.raw.txt").mkdir()


def _gzip_bomb(d: Path) -> None:
    _to_jsonl(d)
    (d / "trn.json").unlink()
    with gzip.open(d / "trn.json.gz", "wb") as fh:
        fh.write(b'{"uid": "x", "title": "' + b"a" * (3 << 20) + b'", "target_ind": [1]}\n')


def _truncated_gzip(d: Path) -> None:
    _to_jsonl(d)
    data = gzip.compress((d / "trn.json").read_bytes())
    (d / "trn.json").unlink()
    (d / "trn.json.gz").write_bytes(data[: len(data) // 2])


def _uid_sidecar_misaligned(d: Path) -> None:
    (d / "trn.jsonl").write_text("".join(json.dumps({"uid": f"u{i}", "text": "other text", "doc": "d"}) + "\n"
                                         for i in range(len(TRN))))


DATASET_CASES = {
    # name: (edit of the dataset dir, extra env, expected fragments of the error line)
    "label_empty_text": (_replace_line("lbl.raw.txt", 3, b"   "), {}, ["lbl.raw.txt:3", "empty text"]),
    "train_empty_text": (_replace_line("trn.raw.txt", 5, b""), {}, ["trn.raw.txt:5", "empty text"]),
    "header_not_numbers": (_replace_line("trn_X_Y.txt", 1, b"a b"), {}, ["trn_X_Y.txt:1", "bad header"]),
    "header_superscript_digit": (_replace_line("trn_X_Y.txt", 1, "2\u00b2 12".encode()), {}, ["trn_X_Y.txt:1", "bad header"]),
    "header_label_count": (_replace_line("trn_X_Y.txt", 1, b"24 13"), {}, ["trn_X_Y.txt:1", "13 labels"]),
    "label_id_out_of_range": (_replace_line("trn_X_Y.txt", 4, b"12:1.0"), {}, ["trn_X_Y.txt:4", "out of range"]),
    "label_id_negative": (_replace_line("trn_X_Y.txt", 4, b"-1:1.0"), {}, ["trn_X_Y.txt:4", "out of range"]),
    "label_id_5000_digits": (_replace_line("trn_X_Y.txt", 4, b"9" * 5000 + b":1"), {}, ["trn_X_Y.txt:4", "bad token"]),
    "label_token_not_int": (_replace_line("trn_X_Y.txt", 6, b"x:1.0"), {}, ["trn_X_Y.txt:6", "bad token"]),
    "label_value_not_number": (_replace_line("trn_X_Y.txt", 6, b"3:abc"), {}, ["trn_X_Y.txt:6", "bad token"]),
    "more_rows_than_header": (_append("trn_X_Y.txt", b"1:1.0\n"), {}, ["trn_X_Y.txt:26", "more rows"]),
    "fewer_rows_than_header": (_replace_line("trn_X_Y.txt", 1, b"30 12"), {}, ["trn_X_Y.txt", "30 rows"]),
    "rows_differ_from_texts": (_append("trn.raw.txt", b"one more text\n"), {}, ["trn_X_Y.txt", "25 texts"]),
    "not_utf8": (_replace_line("trn.raw.txt", 7, b"caf\xe9 au lait"), {}, ["trn.raw.txt:7", "UTF-8"]),
    "nul_byte": (_replace_line("tst.raw.txt", 2, b"binary\x00junk"), {}, ["tst.raw.txt:2", "NUL"]),
    "line_too_long": (_replace_line("trn.raw.txt", 9, b"w " * 5000), {"XMC_MAX_LINE_BYTES": "4096"},
                      ["trn.raw.txt:9", "longer than 4096"]),
    "symlink_to_dev_zero": (_symlink_dev_zero, {}, ["trn.raw.txt", "not a regular file"]),
    "directory_as_file": (_directory_instead, {}, ["tst.raw.txt", "is a directory"]),
    "missing_label_file": (lambda d: (d / "lbl.raw.txt").unlink(), {}, ["no known layout"]),
    "filter_pairs_malformed": (lambda d: (d / "filter_labels_test.txt").write_text("0 1\n2\n"), {},
                               ["filter_labels_test.txt:2", "expected 'row label_id'"]),
    "filter_label_out_of_range": (lambda d: (d / "filter_labels_test.txt").write_text("0 99\n"), {},
                                  ["filter_labels_test.txt:1", "out of range"]),
    "sidecar_misaligned": (_uid_sidecar_misaligned, {}, ["trn.jsonl:1", "misaligned"]),
    "jsonl_invalid_json": (_jsonl_record(3, '{"uid": "t3", "title": "x", '), {}, ["trn.json:4", "invalid JSON"]),
    "jsonl_not_object": (_jsonl_record(3, "[1, 2]"), {}, ["trn.json:4", "expected a JSON object"]),
    "jsonl_missing_target": (_jsonl_record(2, {"uid": "t2", "title": "x"}), {}, ["trn.json:3", "target_ind"]),
    "jsonl_target_strings": (_jsonl_record(2, {"uid": "t2", "title": "x", "target_ind": ["1"]}), {},
                             ["trn.json:3", "list of integers"]),
    "jsonl_target_out_of_range": (_jsonl_record(2, {"uid": "t2", "title": "x", "target_ind": [12]}), {},
                                  ["trn.json:3", "out of range"]),
    "jsonl_target_5000_digits": (_jsonl_record(2, '{"uid": "t2", "title": "x", "target_ind": [' + "9" * 5000 + "]}"), {},
                                 ["trn.json:3", "invalid JSON value"]),
    "jsonl_deeply_nested": (_jsonl_record(2, '{"uid": ' + "[" * 100000 + "]" * 100000 + "}"), {},
                            ["trn.json:3", "nested too deeply"]),
    "jsonl_empty_text": (_jsonl_record(5, {"uid": "t5", "title": "  ", "target_ind": [1]}), {},
                         ["trn.json:6", "empty text"]),
    "jsonl_text_not_string": (_jsonl_record(5, {"uid": "t5", "title": 42, "target_ind": [1]}), {},
                              ["trn.json:6", "not a string"]),
    "gzip_expands_too_far": (_gzip_bomb, {"XMC_MAX_INPUT_BYTES": str(1 << 20), "XMC_MAX_LINE_BYTES": str(8 << 20)},
                             ["trn.json.gz:1", "XMC_MAX_INPUT_BYTES"]),
    "gzip_truncated": (_truncated_gzip, {}, ["trn.json.gz", "compressed data"]),
}


@pytest.mark.parametrize("case", sorted(DATASET_CASES))
def test_bad_dataset_file(repo, tmp_path, case):
    edit, env, expected = DATASET_CASES[case]
    d = write_dataset(tmp_path / "ds")
    edit(d)
    good = (repo / "params.good.yaml").read_text()
    (repo / "params.yaml").write_text(good.replace(str(repo.parent / f"{repo.name}_dataset"), str(d)))
    before = snapshot(repo)
    try:
        code, err = run_stage("stages.ingest", [], repo, env)
    finally:
        (repo / "params.yaml").write_text(good)
    assert_one_line_error(code, err, expected)
    assert snapshot(repo) == before


def assert_one_line_error(code: int, err: str, expected: list[str], exit_code: int | None = EXIT_INPUT_ERROR) -> None:
    lines = error_lines(err)
    assert code != 0, err
    if exit_code is not None:
        assert code == exit_code, (code, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    for frag in expected:
        assert frag in lines[0], (frag, lines[0])


# ------------------------------------------------------------------------------------------------
# 2. params.yaml
DEXML_RUN = "  dexml_bow: {method: dexml}\n"


def _run(name: str, method: str, overrides: str) -> tuple[str, str]:
    """(the product run's line, the line with ``overrides`` added to its entry)."""
    return f"  {name}: {{method: {method}}}\n", f"  {name}: {{method: {method}, {overrides}}}\n"


PARAMS_CASES = {
    # name: (old, new, expected fragments); the stage run is tfidf (it loads params first, every run resolved)
    "unknown_key_did_you_mean": (*_run("dexml_bow", "dexml", "train: {epoch: 3}"),
                                 ["params.yaml:", "runs.dexml_bow.train.epoch", "did you mean 'epochs'"]),
    "misspelt_batch_size": ("{method: dexml, train: {epochs: 10}}", "{method: dexml, train: {epochs: 10, batch_sise: 8}}",
                            ["runs.dexml_bow_epochs10.train.batch_sise", "did you mean 'batch_size'"]),
    "misspelt_shortlist_size": (*_run("ramen", "ramen", "negatives: {shortlist_sise: 100}"),
                                ["runs.ramen.negatives.shortlist_sise", "shortlist_size"]),
    "misspelt_section": ("\nlabel_names:", "\nlabel_name:", ["params.yaml:", "label_name", "did you mean 'label_names'"]),
    "misspelt_method": (DEXML_RUN, "  dexml_bow: {method: dexm}\n",
                        ["runs.dexml_bow.method", "unknown method 'dexm'", "did you mean 'dexml'"]),
    "run_without_method": (DEXML_RUN, "  dexml_bow: {train: {epochs: 2}}\n", ["runs.dexml_bow", "needs method"]),
    "string_for_number": (*_run("unidec", "unidec", "train: {warmup_ratio: ten}"),
                          ["runs.unidec.train.warmup_ratio", "valid number"]),
    "negative_encode_batch_size": ("  encode_batch_size: 256", "  encode_batch_size: -8",
                                   ["index.encode_batch_size", "greater than 0"]),
    "negative_batch_size_in_run": (*_run("dexml_bow", "dexml", "train: {batch_size: -4}"),
                                   ["runs.dexml_bow.train.batch_size", "greater than 0"]),
    "negative_epochs": (*_run("astra", "astra", "train: {epochs: -1}"), ["runs.astra.train.epochs", "greater than 0"]),
    "zero_epochs_trained_run": (*_run("dexml_bow", "dexml", "train: {epochs: 0}"), ["runs.dexml_bow.train.epochs"]),
    "dropout_above_one": (*_run("maclr", "maclr", "encoder: {dropout: 1.5}"),
                          ["runs.maclr.encoder.dropout", "less than 1"]),
    "validation_fraction_above_one": ("    fraction: 0.25", "    fraction: 1.5", ["data.validation.fraction"]),
    "unknown_layout": ("  layout: auto ", "  layout: xml ", ["data.layout", "'auto', 'xc_raw' or 'jsonl'"]),
    "unknown_loss": (*_run("dexml_bow", "dexml", "loss: {name: softmaxx}"), ["runs.dexml_bow.loss.name"]),
    "top_k_zero": ("  top_k: 100 ", "  top_k: 0 ", ["evaluate.top_k"]),
    "ks_above_top_k": ("  ks: [1, 3, 5]", "  ks: [1, 3, 500]", ["evaluate", "exceed top_k"]),
    "duplicate_key": ("  hnsw_m: 32", "  hnsw_m: 32\n  hnsw_m: 16", ["index.hnsw_m", "duplicate key"]),
    "run_defined_twice": ("  unidec: {method: unidec}\n", "  unidec: {method: unidec}\n  unidec: {method: astra}\n",
                          ["runs.unidec", "duplicate key"]),
    "invalid_yaml": ("  ngram_max: 2", "  ngram_max: [2", ["params.yaml:", "not valid YAML"]),
    "hybrid_base_unknown_run": ("{base: ramen}", "{base: ramne}", ["hybrids.ramen_hybrid.base", "did you mean 'ramen'"]),
    "hybrid_fusion_typo": ("{base: maclr, fusion: valtuned}", "{base: maclr, fusion: valtund}",
                           ["hybrids.maclr_valtuned_hybrid.fusion", "'trained' or 'valtuned'"]),
    "paired_unknown_run": ("    - [astra, unidec]", "    - [astra, unidek]", ["report.paired", "did you mean 'unidec'"]),
    "training_family_unknown_run": ("[dexml_bow, ramen, unidec, astra]", "[dexml_bow, ramen, unidek, astra]",
                                    ["report.training_families", "did you mean 'unidec'"]),
    "promote_unknown_package": ("  promote: [astra, dexml_bow]", "  promote: [astra, dexml_bw]",
                                ["registry.promote.1", "did you mean 'dexml_bow'"]),
    "budget_of_unknown_run": (DEXML_RUN, DEXML_RUN + "  st_mnrl: {method: st_mnrl, budget_of: dexm}\n",
                              ["runs.st_mnrl.budget_of", "'dexm' is not a DEXML run"]),
    "maclr_sparse_k_above_mined": (*_run("maclr", "maclr", "stage2: {sparse_k: 9}"),
                                   ["runs.maclr.stage2.sparse_k", "exceeds maclr_pairs.names_k"]),
    "astra_bias_init_word": (*_run("astra", "astra", "model: {bias_init: posterior}"), ["runs.astra.model.bias_init"]),
    "ramen_run_unknown_key": (*_run("ramen", "ramen", "pruning: {enable: false}"),
                              ["runs.ramen.pruning.enable", "did you mean 'enabled'"]),
    "fewshot_run_without_init": (DEXML_RUN, DEXML_RUN + "  maclr_fs1: {method: maclr_fewshot, ratio: 0.01}\n",
                                 ["runs.maclr_fs1.init", "required"]),
    "unidec_batch_below_cluster": (*_run("unidec", "unidec", "psl: {cluster_size: 512}"), ["runs.unidec", "cluster_size"]),
    "not_a_mapping": (None, "- just\n- a list\n", ["params.yaml", "mapping of sections"]),
    "probability_as_percent": ("  title_remove_prob: 0.9 ", "  title_remove_prob: 90 ",
                               ["maclr_pairs.title_remove_prob", "less than or equal to 1"]),
}


@pytest.mark.parametrize("case", sorted(PARAMS_CASES))
def test_bad_params(repo, case):
    old, new, expected = PARAMS_CASES[case]
    good = (repo / "params.good.yaml").read_text()
    if old is None:
        bad = new
    else:
        assert old in good, old
        bad = good.replace(old, new, 1)
    (repo / "params.yaml").write_text(bad)
    before = snapshot(repo)
    try:
        code, err = run_stage("stages.tfidf", [], repo)
    finally:
        (repo / "params.yaml").write_text(good)
    lines = error_lines(err)
    assert code == EXIT_INPUT_ERROR and lines and "Traceback" not in err, err
    assert any(all(f in line for f in expected) for line in lines), (expected, lines)
    assert all(line.startswith("error: params.yaml") for line in lines), lines
    assert snapshot(repo) == before


OUTPUT_PATH_CASES = {
    # a dataset folder that holds the ingest stage's output: writing data/processed would replace part of its input
    "dataset_dir_holds_the_output": (f"{RES}/data", ["refusing to write an output", "input"]),
    "dataset_dir_is_repo_root": (".", ["refusing to write an output", "input"]),
}


@pytest.mark.parametrize("case", sorted(OUTPUT_PATH_CASES))
def test_output_path_that_would_destroy_inputs_is_refused(repo, case):
    where, expected = OUTPUT_PATH_CASES[case]
    dataset = repo.parent / f"{repo.name}_dataset"
    target = repo / where
    copied = [target / f.name for f in dataset.iterdir()]
    for f in dataset.iterdir():
        shutil.copy2(f, target / f.name)
    good = (repo / "params.good.yaml").read_text()
    (repo / "params.yaml").write_text(good.replace(f"dataset_dir: {dataset}", f"dataset_dir: {target}"))
    before = snapshot(repo)
    try:
        code, err = run_stage("stages.ingest", [], repo)
    finally:
        (repo / "params.yaml").write_text(good)
        for f in copied:
            f.unlink()
    assert_one_line_error(code, err, expected)
    assert "data/processed" in error_lines(err)[0]
    assert snapshot(repo) == {k: v for k, v in before.items() if repo / k not in copied}


# ------------------------------------------------------------------------------------------------
# 3. processed artefacts (read by the tfidf stage)
def _corrupt(name: str, data: bytes | Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def edit(processed: Path) -> None:
        p = processed / name
        p.write_bytes(data(p.read_bytes()) if callable(data) else data)
    return edit


def _other_shape_npz(processed: Path) -> None:
    import scipy.sparse as sp

    sp.save_npz(processed / "trn_Y.npz", sp.csr_matrix(np.ones((3, 12), np.float32)))


def _npz_bad_indices(processed: Path) -> None:
    import scipy.sparse as sp

    Y = sp.load_npz(processed / "trn_Y.npz").tocsr()
    Y.indices[0] = 10_000
    np.savez(processed / "trn_Y.npz", indices=Y.indices, indptr=Y.indptr, format=np.array(b"csr"),
             shape=np.array(Y.shape), data=Y.data)


def _replace_with_dir(name: str) -> Callable[[Path], None]:
    def edit(processed: Path) -> None:
        (processed / name).unlink()
        (processed / name).mkdir()
    return edit


PROCESSED_CASES = {
    "jsonl_line_not_json": (_corrupt("trn.jsonl", lambda b: b.replace(b"\n", b"\n{broken\n", 1)), ["trn.jsonl:2", "invalid JSON"]),
    "jsonl_row_without_text": (_corrupt("val.jsonl", lambda b: b'{"uid": "x"}\n' + b), ["val.jsonl:1", "'uid' and 'text'"]),
    "npz_random_bytes": (_corrupt("trn_Y.npz", os.urandom(300)), ["trn_Y.npz", "not a sparse label matrix"]),
    "npz_truncated": (_corrupt("trn_Y.npz", lambda b: b[: len(b) // 2]), ["trn_Y.npz", "not a sparse label matrix"]),
    "npz_other_shape": (_other_shape_npz, ["trn_Y.npz", "3 rows but trn.jsonl"]),
    "npz_index_out_of_range": (_npz_bad_indices, ["trn_Y.npz", "not a sparse label matrix"]),
    "npz_is_directory": (_replace_with_dir("trn_Y.npz"), ["trn_Y.npz", "is a directory"]),
    "label_file_missing": (lambda p: (p / "lbl.jsonl").unlink(), ["lbl.jsonl", "missing from the processed dataset"]),
    "label_file_not_utf8": (_corrupt("lbl.jsonl", lambda b: b"\xff\xfe" + b), ["lbl.jsonl:1", "UTF-8"]),
    "pickle_in_npz": (lambda p: np.savez(p / "trn_Y.npz", data=np.array([object()], dtype=object)),
                      ["trn_Y.npz", "not a sparse label matrix"]),
}


@pytest.fixture()
def processed_restore(repo):
    src = results_of(repo) / "data" / "processed"
    keep = {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()}
    yield src
    for p in list(src.iterdir()):
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    for name, data in keep.items():
        (src / name).write_bytes(data)


@pytest.mark.parametrize("case", sorted(PROCESSED_CASES))
def test_bad_processed_artefact(repo, processed_restore, case):
    edit, expected = PROCESSED_CASES[case]
    before_tfidf = {k: v for k, v in snapshot(repo).items() if not k.startswith(f"{RES}/data/processed")}
    edit(processed_restore)
    code, err = run_stage("stages.tfidf", [], repo)
    assert_one_line_error(code, err, expected)
    assert {k: v for k, v in snapshot(repo).items() if not k.startswith(f"{RES}/data/processed")} == before_tfidf


# ------------------------------------------------------------------------------------------------
# 4. model packages and prediction input (xmc predict PACKAGE)
class _Planted:
    def __reduce__(self):
        return (os.system, ("touch PLANTED_CODE_RAN",))


def _pkg(repo: Path, tmp: Path, edit: Callable[[Path], object] | None = None) -> dict[str, str]:
    """A copy of the tiny package, edited; the MODEL argument pointing at it."""
    p = tmp / "pkg"
    shutil.copytree(results_of(repo) / "packages/tiny", p)
    if edit is not None:
        edit(p)
    return {"MODEL": str(p)}


def _predictor_setting(p: Path, key: str, value: object) -> Path:
    """The package's manifest with one value of its predictor section changed (by hand, or by a bad writer)."""
    m = json.loads((p / "manifest.json").read_text())
    m["predictor"][key] = value
    return _write(p / "manifest.json", json.dumps(m).encode())


def _same_size(p: Path, data: bytes, pad: bytes = b" ") -> Path:
    """Overwrite ``p`` with ``data`` padded to the file's size: the package's size check passes, so the
    loader of that file must find the problem itself."""
    size = p.stat().st_size
    assert len(data) <= size, (p, len(data), size)
    return _write(p, data + pad * (size - len(data)))


def _one_label(p: Path) -> Path:
    line = b'{"uid": "a", "text": "x"}'
    return _same_size(p, line + b" " * (p.stat().st_size - len(line) - 1) + b"\n", b"")


PREDICT_CASES = {
    # name: (setup(repo, tmp) -> {arg: value}, expected fragments)
    "package_folder_missing": (lambda r, t: {"MODEL": str(t / "nope")}, ["nope", "not found"]),
    "package_without_manifest": (lambda r, t: _pkg(r, t, lambda p: (p / "manifest.json").unlink()),
                                 ["manifest.json"]),
    "manifest_malformed": (lambda r, t: _pkg(r, t, lambda p: _write(p / "manifest.json", b'{"format":')),
                           ["manifest.json", "JSON"]),
    "file_missing": (lambda r, t: _pkg(r, t, lambda p: (p / "encoder/xmc_encoder.json").unlink()),
                     ["xmc_encoder.json", "listed in the manifest but missing"]),
    "index_folder_missing": (lambda r, t: _pkg(r, t, lambda p: shutil.rmtree(p / "index")), ["index", "missing"]),
    "file_truncated": (lambda r, t: _pkg(r, t, lambda p: _write(p / "encoder/bow_encoder.pt",
                                                               (p / "encoder/bow_encoder.pt").read_bytes()[:1500])),
                       ["bow_encoder.pt", "corrupt or partly copied"]),
    "encoder_description_malformed": (lambda r, t: _pkg(r, t, lambda p: _same_size(p / "encoder/xmc_encoder.json",
                                                                                    b'{"kind": "bow",')),
                                      ["xmc_encoder.json:1", "malformed JSON"]),
    "encoder_weights_random_bytes": (lambda r, t: _pkg(r, t, lambda p: _same_size(
        p / "encoder/bow_encoder.pt", os.urandom((p / "encoder/bow_encoder.pt").stat().st_size))),
                                     ["bow_encoder.pt", "not a tensor file"]),
    "encoder_weights_planted_pickle": (lambda r, t: _pkg(r, t, lambda p: _same_size(p / "encoder/bow_encoder.pt",
                                                                                     pickle.dumps(_Planted()), b"\0")),
                                       ["bow_encoder.pt", "not a tensor file"]),
    "encoder_weights_wrong_shape": (lambda r, t: _pkg(r, t, lambda p: _same_size(p / "encoder/xmc_encoder.json", json.dumps(
        {"kind": "bow", "dim": 32, "n_buckets": 4096, "ngram_max": 1, "tied": True, "seed": 0,
         "storage": "touched_rows"}).encode())),
                                    ["bow_encoder.pt", "does not match"]),
    "encoder_rows_of_other_buckets": (lambda r, t: _pkg(r, t, lambda p: _same_size(p / "encoder/xmc_encoder.json", json.dumps(
        {"kind": "bow", "dim": 16, "n_buckets": 8, "ngram_max": 1, "tied": True, "seed": 0,
         "storage": "touched_rows"}).encode())),
                                    ["bow_encoder.pt", "does not match"]),
    "index_faiss_corrupt": (lambda r, t: _pkg(r, t, lambda p: _same_size(
        p / "index/index.faiss", os.urandom((p / "index/index.faiss").stat().st_size))),
                            ["index.faiss", "not a faiss index"]),
    "index_description_malformed": (lambda r, t: _pkg(r, t, lambda p: _same_size(p / "index/index.json", b"{")),
                                    ["index.json", "not an index description"]),
    "manifest_negative_batch_size": (lambda r, t: _pkg(r, t, lambda p: _predictor_setting(p, "encode_batch_size", -4)),
                                     ["manifest.json", "encode_batch_size -4", "not an integer in [1, 65536]"]),
    "manifest_batch_size_not_a_number": (lambda r, t: _pkg(r, t, lambda p: _predictor_setting(
        p, "encode_batch_size", "256")), ["manifest.json", "encode_batch_size"]),
    "manifest_index_outside_the_package": (lambda r, t: _pkg(r, t, lambda p: _predictor_setting(p, "index", "../../x")),
                                           ["manifest.json", "not a folder inside the package"]),
    "manifest_encoder_absolute_path": (lambda r, t: _pkg(r, t, lambda p: _predictor_setting(p, "encoder", "/etc")),
                                       ["manifest.json", "not a folder inside the package"]),
    "labels_do_not_match_index": (lambda r, t: _pkg(r, t, lambda p: _one_label(p / "labels.jsonl")),
                                  ["labels.jsonl", "1 label"]),
    "package_for_another_label_set": (lambda r, t: {"--expect-labels": "0" * 64}, ["label set"]),
    "k_zero": (lambda r, t: {"-k": "0"}, ["k must be an integer in [1, 10000]"]),
    "k_huge": (lambda r, t: {"-k": str(10**9)}, ["k must be an integer in [1, 10000]"]),
    "input_empty_line": (lambda r, t: {"--input": str(_write(t / "in.txt", b"good text\n\nmore\n"))}, ["in.txt:2", "empty text"]),
    "input_jsonl_without_text": (lambda r, t: {"--input": str(_write(t / "in.jsonl", b'{"id": 1}\n'))},
                                 ["in.jsonl:1", "'text'"]),
    "input_not_utf8": (lambda r, t: {"--input": str(_write(t / "in.txt", b"ok\n\xff\xfe bad\n"))}, ["in.txt:2", "UTF-8"]),
    "input_gzip_truncated": (lambda r, t: {"--input": str(_write(t / "in.txt.gz", gzip.compress(
        b"".join(b"sentence %d about a river bank\n" % i for i in range(2000)))[:300]))},
                             ["in.txt.gz:", "unreadable compressed data"]),
    "input_gzip_not_gzip": (lambda r, t: {"--input": str(_write(t / "in.txt.gz", b"plain text\n"))},
                            ["in.txt.gz:1", "unreadable compressed data"]),
    "input_missing": (lambda r, t: {"--input": str(t / "absent.txt")}, ["absent.txt", "not found"]),
    "input_dev_zero": (lambda r, t: {"--input": "/dev/zero"}, ["/dev/zero", "not a regular file"]),
    "output_overwrites_input": (lambda r, t: {"--output": "batch/in.txt"}, ["the output would overwrite the input"]),
    "output_inside_model": (lambda r, t: {"--output": f"{RES}/packages/tiny/pred.jsonl"}, ["the output would overwrite the model"]),
}


def _write(p: Path, data: bytes) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def _rm(p: Path) -> Path:
    p.unlink()
    return p


@pytest.mark.parametrize("case", sorted(PREDICT_CASES))
def test_bad_model_package_or_prediction_input(repo, tmp_path, case):
    setup, expected = PREDICT_CASES[case]
    args = dict(zip(PREDICT_ARGS[2::2], PREDICT_ARGS[3::2]))
    args["MODEL"] = PREDICT_ARGS[1]
    args.update(setup(repo, tmp_path))
    before = snapshot(repo)
    argv = ["predict", args.pop("MODEL")] + [x for kv in args.items() for x in kv]
    code, err = run_stage("xmc.cli", argv, repo)
    assert_one_line_error(code, err, expected)
    assert snapshot(repo) == before
    assert not (repo / "PLANTED_CODE_RAN").exists() and not (tmp_path / "PLANTED_CODE_RAN").exists()


def test_planted_pickle_checkpoint_is_refused_not_run(tmp_path):
    from xmc.errors import DataFormatError
    from xmc.trainer.checkpoint import load_checkpoint

    ck = tmp_path / "checkpoint.pt"
    import torch

    torch.save({"fingerprint": "x", "evil": _Planted()}, ck)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(DataFormatError, match="checkpoint.pt"):
            load_checkpoint(ck)
    finally:
        os.chdir(cwd)
    assert not (tmp_path / "PLANTED_CODE_RAN").exists()


def test_checkpoint_state_round_trips_without_pickle(tmp_path):
    """numpy arrays, ragged object arrays, tuples and numpy scalars survive a weights_only round trip."""
    import torch

    from xmc.trainer.checkpoint import load_checkpoint, save_checkpoint

    ragged = np.empty(2, dtype=object)
    ragged[:] = [np.arange(3), np.arange(5)]
    state = {"shortlist": np.arange(12, dtype=np.int32).reshape(3, 4), "pending": (1, np.ones(2), 0.5),
             "chunks": ragged, "k": np.int64(7), "rng": torch.get_rng_state(), "hist": [{"loss": 1.5}], "none": None}
    save_checkpoint(state, tmp_path / "c.pt")
    back = load_checkpoint(tmp_path / "c.pt")
    assert back["shortlist"].dtype == np.int32 and (back["shortlist"] == state["shortlist"]).all()
    assert isinstance(back["pending"], tuple) and back["pending"][0] == 1 and back["pending"][2] == 0.5
    assert [list(x) for x in back["chunks"]] == [[0, 1, 2], [0, 1, 2, 3, 4]]
    assert back["k"] == 7 and torch.equal(back["rng"], state["rng"]) and back["hist"] == [{"loss": 1.5}]
    assert not list(tmp_path.glob(".c.pt.tmp-*"))


def test_debug_switch_shows_the_traceback(repo):
    good = (repo / "params.good.yaml").read_text()
    (repo / "params.yaml").write_text(good.replace("  top_k: 100 ", "  top_k: 0 "))
    try:
        with pytest.raises(Exception, match="evaluate.top_k"):
            run_stage("stages.tfidf", ["--debug"], repo)
    finally:
        (repo / "params.yaml").write_text(good)


def test_atomic_outputs_follow_the_umask(tmp_path):
    from xmc.io import atomic_dir, atomic_file

    old = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "d") as t:
            (t / "x").write_text("1")
        with atomic_file(tmp_path / "f.txt") as fh:
            fh.write("1")
    finally:
        os.umask(old)
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o644
