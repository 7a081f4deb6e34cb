"""The scale benchmark's path at a small synthetic size: the stages of four of its runs run through DVC on
generated data (Zipf labels, label texts, a label graph, document groups), the models learn something, and the
benchmark's record (per-stage seconds and peak RSS, growth exponents) comes out. `make scale-bench` runs the same
code at 10^4..10^6."""

from __future__ import annotations

import json

import pytest

from lab.bench import scale


# the harness on four of the profile's runs: a baseline, a TF-IDF run with capped postings, and the two trained
# bag-of-words runs whose prediction indexes the calibration chooses (every method's own path through the pipeline
# is tests/test_methods_e2e.py's)
SMALL_PATH = ["label_prior", "tfidf_knn", "dexml_bow", "astra"]


def test_scale_benchmark_path_runs_at_a_small_size(tmp_path):
    out, png = tmp_path / "scale.json", tmp_path / "scale.png"
    result = scale.main(["--sizes", "1200", "--epochs", "1", "--work", str(tmp_path / "work"), "--out", str(out),
                         "--plot", str(png), "--stage-timeout", "600", "--auto-exact-max", "600",
                         "--methods", ",".join(SMALL_PATH),
                         "--bow-buckets", "16384"])   # a 16 MB table: at 1,200 instances the 268 MB one is most of the time
    run = result["runs"][0]
    assert result["profile"]["encoder"]["n_buckets"] == 16384 and result["profile"]["encoder"]["dim"] == 256
    assert run["completed"], [s for s in run["stages"] if not s["ok"]]
    ran = {s["stage"] for s in run["stages"]}
    runs = set(SMALL_PATH)
    assert result["profile"]["methods"] == SMALL_PATH
    assert {"ingest", "validate", "tfidf", "graph", "maclr_pseudo_pairs", "plan", "report"} <= ran, ran
    assert {f"{stage}@{r}" for r in runs for stage in ("train", "package")} <= ran, ran
    # the profile's runs only: no hybrid, no linear peer, and UniDEC in its main space only (its DE-only and
    # classifier-only spaces are lab runs)
    assert not {s for s in ran if s.startswith(("fuse@", "xr_linear@"))}, ran
    assert {s.split("@", 1)[1] for s in ran if "@" in s} == runs, ran
    assert not {"unidec_de_only", "unidec_clf_only"} & set(run["indexes"])
    assert all(s["seconds"] > 0 and s["peak_rss_mib"] > 10 for s in run["stages"])
    # each stage's own peak, not the resident size of the process that launched it (a forked child starts there):
    # the report stage imports no torch (ingest does, through xmc.features)
    peaks = {s["stage"]: s["peak_rss_mib"] for s in run["stages"]}
    assert peaks["report"] < 300 < peaks["train@astra"], peaks
    # learnable synthetic data: the trained bag-of-words models and TF-IDF rank true labels far above chance
    assert run["metrics"]["tfidf_knn"]["P@1"] > 5 and run["metrics"]["astra"]["P@1"] > 5, run["metrics"]
    # above auto_exact_max the prediction indexes are IVF with the search width calibrated on training queries to
    # the recall target (the validation queries' recall comes near it); where that width searched no faster than
    # brute force, a PQ scan calibrated the same way, and where that was no faster either, exact search
    assert set(run["indexes"]) >= {"dexml_bow", "astra"}, run["indexes"]
    for m, ix in run["indexes"].items():
        # index.shortlist auto: each dense run first ranks the validation texts by its TF-IDF shortlist and by
        # exact search; it keeps the shortlist unless that is significantly worse, else builds the index
        sl = ix["shortlist"]
        assert sl["metric"] == "P@5" and sl["verdict"] in ("tie", "shortlist better", "exact better"), (m, sl)
        assert sl["kept"] == (sl["verdict"] != "exact better") and 0 <= sl["recall_against_exact"] <= 1, (m, sl)
        if sl["kept"]:
            assert ix["kind"] == "tfidf_shortlist" and "calibrated" not in ix, (m, ix)
            assert ix["recall_at_100"] == sl["recall_against_exact"], (m, ix)
            continue
        cal = ix["calibrated"]
        assert cal["value"] >= 1, (m, ix)
        if cal["fallback"] == "exact":
            assert ix["kind"] == "exact" and cal["search_seconds_per_1000"] >= cal["exact_seconds_per_1000"], (m, ix)
        elif cal["fallback"] == "pq":
            before = cal["before"]
            assert before["kind"] == "ivf" and before["search_seconds_per_1000"] >= before["exact_seconds_per_1000"]
            assert ix["kind"] == "pq" and cal["knob"] == "k_factor", (m, ix)
            assert cal["search_seconds_per_1000"] < cal["exact_seconds_per_1000"], (m, ix)
            assert ix["recall_at_100"] > cal["recall_target"] - 0.15, (m, ix)
        else:
            assert ix["kind"] == "ivf" and cal["knob"] == "nprobe", (m, ix)
            assert cal["recall"] >= cal["recall_target"] or cal["value"] >= 138, (m, ix)
            assert ix["recall_at_100"] > cal["recall_target"] - 0.15, (m, ix)
    assert json.loads(out.read_text())["runs"][0]["n"] == 1200 and png.stat().st_size > 10_000
    assert result["growth"]["ingest"]["seconds"]["exponent"] is None   # one size: no slope yet
    assert not (tmp_path / "work" / "repo_1200").exists()   # workspaces are removed unless --keep


def test_growth_exponent_is_the_log_log_slope():
    g = scale.growth([10_000, 100_000, 1_000_000], [2.0, 20.0, 200.0])
    assert g["exponent"] == 1.0 and g["pairwise"] == [1.0, 1.0]
    g = scale.growth([10_000, 100_000], [1.0, 100.0])
    assert g["exponent"] == 2.0


def test_growth_table_uses_the_sizes_where_each_stage_finished():
    def run(n, secs, ok=True):
        return {"n": n, "completed": ok,
                "stages": [{"stage": "tfidf", "seconds": secs, "ok": True, "peak_rss_mib": 100.0},
                           {"stage": "train", "seconds": secs, "ok": ok, "peak_rss_mib": 100.0}]}

    # the largest size stopped at "train": its tfidf row counts, its train row (a timeout) does not
    table = scale.growth_table([run(10_000, 1.0), run(100_000, 10.0), run(1_000_000, 100.0, ok=False)])
    assert table["tfidf"]["seconds"]["exponent"] == 1.0 and table["tfidf"]["seconds"]["pairwise"] == [1.0, 1.0]
    assert table["tfidf"]["peak_rss"]["exponent"] == 0.0
    assert table["train"]["seconds"]["pairwise"] == [1.0]


def test_an_interrupted_run_resumes_from_its_recorded_rows(tmp_path):
    work = tmp_path / "work"
    args = ["--sizes", "300", "--work", str(work), "--targets", "tfidf", "--stage-timeout", "300", "--plot", ""]
    first = scale.main([*args, "--out", str(tmp_path / "a.json"), "--keep"])["runs"][0]
    assert first["completed"] and [s["stage"] for s in first["stages"]][-1] == "tfidf"
    rows_file = work / "rows_300.jsonl"
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert [r["stage"] for r in rows] == [s["stage"] for s in first["stages"]]
    # the run "died" during its last stage: its row was never written
    rows_file.write_text("".join(json.dumps(r) + "\n" for r in rows[:-1]))
    again = scale.main([*args, "--out", str(tmp_path / "b.json"), "--resume"])["runs"][0]
    assert again["completed"] and again["commit"] == first["commit"] and again["dataset"] == first["dataset"]
    assert again["stages"][:-1] == rows[:-1]                       # kept, not rerun
    assert again["stages"][-1]["stage"] == "tfidf" and again["stages"][-1] != rows[-1]   # forced again
    assert len(rows_file.read_text().splitlines()) == len(rows)
    collected = scale.main([*args, "--out", str(tmp_path / "c.json"), "--collect"])["runs"][0]
    assert collected["stages"] == again["stages"]                  # nothing run: the recorded rows


def test_the_profile_runs_a_chosen_subset_of_its_methods():
    assert list(scale.scale_params(1)["runs"]) == scale.METHODS
    assert list(scale.scale_params(1, methods=["astra", "label_prior"])["runs"]) == ["label_prior", "astra"]
    with pytest.raises(SystemExit, match="--methods: dexml not in the scale profile"):
        scale.scale_params(1, methods=["dexml", "astra"])
