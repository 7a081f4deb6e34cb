"""Reports a person can read: the comparison page fits a laptop screen, the figures tell the groups of methods
apart, bare ``dvc metrics show`` is a table of headline scalars, ``dvc plots show`` draws a few chosen curves, and
no training record holds a file its run did not write."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from stages.report import methods_of
from stages.train import remove_stale_record_files
from xmc.io import write_json
from xmc.report import render_figures, render_html
from xmc.report.figures import CONTEXT_GREY, PAPER_COLOURS, group_styles
from xmc.report.headline import HEADLINE_METRICS, full_records, headline, headline_path, main as headline_main

ROOT = Path(__file__).resolve().parents[1]
DATASETS = sorted(p.parent.name for p in (ROOT / "results").glob("*/dataset.json"))
PAPER_RUNS = ["dexml_bow", "maclr", "ramen", "unidec", "astra"]


def _params() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def _row(method: str, p1: float, **kw: Any) -> dict[str, Any]:
    return {"method": method, "P@1": p1, "P@5": p1 / 2, "R@100": 90.0, "n_test": 100,
            "ci95": {"P@1": [p1 - 2, p1 + 2], "P@5": [p1 / 2 - 1, p1 / 2 + 1]}, **kw}


# ------------------------------------------------------------------------------------------ the comparison page


def _css(page: str) -> str:
    return re.search(r"<style>(.*?)</style>", page, re.S).group(1)


def test_comparison_page_fits_a_laptop_screen():
    rows = [_row("tfidf_knn", 50.0, labelled_pairs="training pairs"),
            _row("astra", 70.0, labelled_pairs="training pairs"),
            _row("astra_hybrid", 80.0, labelled_pairs="no training pairs; fusion fit on labelled validation")]
    paired = [{"a": "astra", "b": "tfidf_knn", "metric": m, "a_value": 70.0, "b_value": 50.0, "diff": 20.0,
               "ci95": [18.0, 22.0], "p_value": 0.001, "p_holm": 0.004, "better": "astra", "n": 100,
               "unit": "instances", "n_units": 100, "n_resamples": 1000, "seed": 0, "level": 0.95}
              for m in ("P@1", "P@5")]
    page = render_html(rows, "t", [], bootstrap={"level": 0.95, "n_resamples": 1000, "seed": 0}, paired=paired)
    css = _css(page)
    # the page has a width a laptop shows; a wide table scrolls inside its own box, its first column stays
    width = re.search(r"body\{[^}]*max-width:(\d+)px", css)
    assert width and int(width.group(1)) <= 1400, css
    assert re.search(r"\.wrap\{[^}]*overflow-x:auto", css) and re.search(r"first-child\{[^}]*position:sticky", css)
    assert page.count("<table") == page.count("<div class='wrap'><table")
    # each interval is a block of its own under the value, in a smaller font
    assert re.search(r"\.ci\{[^}]*display:block[^}]*font-size:80%", css)
    assert "70.0<span class='ci'>[68.0, 72.0]</span>" in page
    # texts wrap (the 'labelled pairs used' column), numbers do not
    assert re.search(r"td\.text\{[^}]*white-space:normal[^}]*max-width:15em", css)
    assert "<td class='text'>no training pairs; fusion fit on labelled validation" in page
    # the long tables are collapsed sections that say what they hold
    assert re.search(r"<details><summary>2 tests: 2 differences significant after Holm&#x27;s correction, 0 ties"
                     r"</summary><div class='wrap'><table>", page), page
    # self-contained: nothing remote, no script
    assert "http" not in page.replace("<!doctype html>", "") and "<script" not in page and "<link" not in page


def test_comparison_page_shows_the_hybrids_by_name_match_collapsed():
    side = {"texts": 40, "base P@1": 50.0, "hybrid P@1": 49.0, "P@1 diff": -1.0, "P@1 diff ci95": [-3.0, 1.0]}
    rows = [_row("astra", 50.0), _row("astra_hybrid", 60.0, by_name_match={"with_correct_name_match": side,
                                                                             "without": side})]
    page = render_html(rows, "t", [])
    section = page[page.index("Hybrids on texts with and without a correct name match"):]
    assert section.index("<details><summary>1 row (hybrid × split)") < section.index("-1.00 [-3.00, 1.00]")


@pytest.mark.parametrize("ds", DATASETS)
def test_committed_comparison_pages_use_the_wrapping_layout(ds):
    page = (ROOT / "results" / ds / "reports/comparison.html").read_text()
    css = _css(page)
    assert re.search(r"body\{[^}]*max-width:1360px", css) and ".wrap{" in css and "display:block" in css
    assert "<details><summary>" in page and page.count("<table") == page.count("<div class='wrap'><table")
    # no interval sits on the line of its value any more (the old layout: "value <span class='ci'>")
    assert " <span class='ci'>" not in page


# ------------------------------------------------------------------------------------------ figures


def test_figures_give_the_papers_methods_distinct_colours_and_the_peers_greys():
    params = _params()
    names = list(params["runs"]) + list(params["xr_linear"]) + list(params["hybrids"])
    st = group_styles(names, methods_of(params))

    def is_grey(c: str) -> bool:
        return c[1:3] == c[3:5] == c[5:7]

    # the five papers: five colours, none a grey, each its own; their hybrids keep it, with another line style
    colours = [st[r]["color"] for r in PAPER_RUNS]
    assert len(set(colours)) == 5 and not any(is_grey(c) for c in colours)
    assert {r: st[r]["paper"] for r in PAPER_RUNS} == {r: r.split("_")[0] for r in PAPER_RUNS}
    for r in PAPER_RUNS:
        hyb = st[f"{r}_hybrid"] if f"{r}_hybrid" in st else None
        if hyb:
            assert hyb["color"] == st[r]["color"] and hyb["linestyle"] != st[r]["linestyle"] and hyb["group"] == "hybrid"
    # dexml_bow_hybrid's base is dexml_bow_epochs10: still DEXML's colour
    assert st["dexml_bow_hybrid"]["color"] == PAPER_COLOURS["dexml"] == st["dexml_bow_epochs10"]["color"]
    # baselines, peers and their hybrids are greys, in the peer panel or grey among the hybrids
    for n in ("label_prior", "tfidf_knn", "xr_linear", "name_match", "minilm_zeroshot", "tfidf_knn_hybrid"):
        assert is_grey(st[n]["color"]) and st[n]["paper"] is None, n
    assert {st[n]["group"] for n in ("label_prior", "xr_linear", "minilm_zeroshot")} == {"peer"}
    assert st["astra"]["linewidth"] > st["xr_linear"]["linewidth"]


def test_curve_figure_draws_one_panel_per_group_with_the_peers_behind(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["tfidf_knn", "xr_linear", "astra", "ramen", "astra_hybrid"]
    for i, n in enumerate(names):
        write_json(tmp_path / "eval" / n / "at_k.json", [{"k": k, "precision": 50.0 - k - i, "recall": 10.0 * k}
                                                        for k in (1, 2, 5)])
    saved: list[Any] = []
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **kw: saved.append(fig))
    page = render_figures(names, tmp_path / "eval", tmp_path / "train", tmp_path / "fig", {})
    assert [c["file"] for c in page["curves"]] == ["precision_at_k.png", "recall_at_k.png"]
    peers, methods, hybrids = saved[0].axes
    assert [ax.get_title() for ax in saved[0].axes] == ["Baselines and peers", "The papers' methods",
                                                        "With label-name candidates (hybrids)"]
    labelled = {ax.get_title(): {ln.get_label(): ln.get_color() for ln in ax.lines if not ln.get_label().startswith("_")}
                for ax in saved[0].axes}
    assert set(labelled["The papers' methods"]) == {"astra", "ramen"}
    assert labelled["The papers' methods"]["astra"] == PAPER_COLOURS["astra"] != labelled["The papers' methods"]["ramen"]
    assert labelled["With label-name candidates (hybrids)"] == {"astra_hybrid": PAPER_COLOURS["astra"]}
    # the two peers again, faint and unlabelled, behind each other panel
    for ax in (methods, hybrids):
        assert sum(ln.get_color() == CONTEXT_GREY for ln in ax.lines) == 2


# ------------------------------------------------------------------------------------------ dvc metrics, dvc plots


def _dvc_yaml() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())


def _declared(kind: str) -> list[str]:
    """Every path declared under ``kind`` (metrics or plots) of a stage of dvc.yaml, templated."""
    out = []
    for st in _dvc_yaml()["stages"].values():
        for entry in (st.get("do") or st).get(kind, []):
            out.append(next(iter(entry)) if isinstance(entry, dict) else entry)
    return out


def _expand(path: str, ds: str, key: str) -> Path:
    return ROOT / path.replace("${data.name}", ds).replace("${key}", key)


def test_declared_metrics_are_the_headline_files():
    declared = _declared("metrics")
    assert declared and all("/key_metrics/" in p for p in declared), declared
    assert _declared("plots") == []   # the plots are the few chosen ones at the top level


@pytest.mark.parametrize("ds", DATASETS)
def test_committed_metrics_files_declared_in_dvc_yaml_hold_only_scalars(ds):
    params = _params()
    stages = _dvc_yaml()["stages"]
    checked = 0
    for stage, keys in (("package", params["runs"]), ("fuse", params["hybrids"]), ("xr_linear", params["xr_linear"])):
        for entry in stages[stage]["do"]["metrics"]:
            for key in keys:
                f = _expand(next(iter(entry)), ds, key)
                if not (f.parent.parent / f.name).is_file():
                    continue   # a row not evaluated on this dataset yet: no full record, no headline
                m = json.loads(f.read_text())
                assert m and all(isinstance(v, int | float) and not isinstance(v, bool) for v in m.values()), f
                assert list(m) == [k for k in HEADLINE_METRICS if k in m]
                # the same values as the full record beside it
                full = json.loads((f.parent.parent / f.name).read_text())
                assert m == headline(full), f
                checked += 1
    assert checked >= 2 * len(PAPER_RUNS)


def test_headline_conversion_keeps_the_full_record_and_writes_scalars(tmp_path, capsys):
    full = {"P@1": 50.0, "P@3": 40.0, "P@5": 30.0, "nDCG@5": 35.0, "PSP@5": 20.0, "R@100": 90.0, "n_test": 9,
            "ci95": {"P@1": [48.0, 52.0]}, "ci95_unit": "documents",
            "by_name_match": {"without": {"texts": 3, "P@1 diff ci95": [-1.0, 1.0]}}}
    write_json(tmp_path / "metrics/a.json", full)
    write_json(tmp_path / "metrics_val/a.json", dict(full, **{"P@1": float("nan")}))
    headline_main([str(tmp_path)])
    assert "2 headline files" in capsys.readouterr().out
    assert json.loads((tmp_path / "metrics/a.json").read_text()) == full
    assert json.loads(headline_path(tmp_path / "metrics/a.json").read_text()) == {
        "P@1": 50.0, "P@5": 30.0, "nDCG@5": 35.0, "PSP@5": 20.0, "R@100": 90.0}
    assert "P@1" not in json.loads((tmp_path / "metrics_val/key_metrics/a.json").read_text())
    assert full_records(tmp_path) == [tmp_path / "metrics/a.json", tmp_path / "metrics_val/a.json"]


def test_dvc_metrics_show_fits_a_terminal():
    """Bare ``dvc metrics show`` on the workspace's files: the headline columns only, rows a terminal shows."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    p = subprocess.run(["dvc", "metrics", "show"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    if p.returncode != 0:
        pytest.skip(f"dvc metrics show: {p.stderr.strip()[-200:]}")
    lines = p.stdout.splitlines()
    assert set(lines[0].split()[1:]) == set(HEADLINE_METRICS), lines[0]
    assert max(map(len, lines)) <= 130 and "ci95" not in p.stdout and "by_name_match" not in p.stdout


def test_top_level_plots_are_few_and_name_existing_curves():
    plots = _dvc_yaml()["plots"]
    assert 1 <= len(plots) <= 6
    for entry in plots:
        (title, spec), = entry.items()
        assert spec["x"] in ("k", "step") and 1 <= len(spec["y"]) <= 8, title
        for path in spec["y"]:
            # the evaluation curves are committed: every one named exists for every dataset
            if "/plots/eval/" in path:
                for ds in DATASETS:
                    assert _expand(path, ds, "").is_file(), (title, path)


# ------------------------------------------------------------------------------------------ stale records


def test_no_stale_files_under_plots():
    """What git holds under results/*/plots/ is the evaluation curves of the rows params.yaml names, nothing else
    (no training record, no old writer's loss.csv)."""
    params = _params()
    rows = set(params["runs"]) | set(params["hybrids"]) | set(params["xr_linear"])
    tracked = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    under = [f for f in tracked if "/plots/" in f]
    assert under
    for f in under:
        parts = Path(f).parts   # results/<ds>/plots/eval/<row>/<file>
        assert parts[2:4] == ("plots", "eval") and parts[4] in rows and len(parts) == 6, f
        assert parts[5] in ("at_k.json", "recall_by_frequency.json"), f
    # a training record on this machine holds only what the training writes
    for record in (ROOT / "results").glob("*/plots/train/*"):
        for f in (x for x in record.rglob("*") if x.is_file()):
            rel = f.relative_to(record).as_posix()
            assert rel == "metrics.json" or rel.startswith("plots/metrics/"), f


def test_training_stage_removes_files_the_record_does_not_hold(tmp_path):
    record = tmp_path / "plots/train/astra"
    keep = [record / "metrics.json", record / "plots/metrics/train/loss.tsv", record / "plots/metrics/val/P@5.tsv"]
    stale = [record / "loss.csv", record / "validation.csv", record / "old/report.html", record / "plots/x.csv"]
    for f in keep + stale:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x")
    assert sorted(remove_stale_record_files(record)) == sorted(stale)
    assert all(f.is_file() for f in keep) and not any(f.exists() for f in stale)
    assert not (record / "old").exists() and (record / "plots/metrics").is_dir()
    assert remove_stale_record_files(record) == [] and remove_stale_record_files(tmp_path / "none") == []
