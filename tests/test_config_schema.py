"""The params.yaml schema: the shipped file passes, run overrides stay partial in the loaded params and are resolved
typed onto their method's defaults file (xmc/config/defaults/<method>.yaml, xmc.config.runs), and the schema is the
only place a params default lives: a library builder given a partial section fills it from the schema (so a stage and
a direct library call build the same thing), and no ``.get("<key>", <literal>)`` duplicates a schema default."""

from __future__ import annotations

import ast
import dataclasses
import re

import numpy as np
import pytest
import scipy.sparse as sp
import yaml

import lab.config as lab_config
from lab.config import SelectionConfig
from tests.pipeline_repo import ROOT
from xmc.config import load_params
from xmc.config import schema
from xmc.config.params import product_names
from xmc.config.runs import (CONTEXT_SECTIONS, RUN_SCHEMAS, main_knobs, method_defaults, resolve_run, resolve_runs,
                             single_run)
from xmc.config.schema import (
    BootstrapConfig,
    EncoderConfig,
    EvaluateConfig,
    IndexConfig,
    NegativesConfig,
    TfidfConfig,
    TrainSection,
    deep_merge,
    filled,
)
from xmc.errors import ConfigError
from xmc.yaml12 import line_of, yaml_key_lines


def _product() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_shipped_params_pass_and_get_every_default():
    p = load_params(ROOT / "params.yaml")
    # a run's overrides stay partial in the loaded params: merging them onto the method's defaults is resolve_run's
    assert p["runs"]["dexml_bow"] == {"method": "dexml"}
    assert p["runs"]["dexml_bow_epochs10"] == {"method": "dexml", "train": {"epochs": 10}}
    run = resolve_run(p, "dexml_bow")
    assert run.method == "dexml" and run.where == "runs.dexml_bow"
    assert run.config["train"]["schedule"] == "linear" and run.config["train"]["device"] == "auto"
    # a loss's unset hyperparameters are left to the loss class
    assert run.config["loss"] == {"name": "decoupled_softmax", "temperature": 0.05}
    # the other sections get every default of the schema
    assert p["index"]["kind"] == "auto" and p["hybrid"]["cross_fit_folds"] == 2 and p["serve"]["port"] == 8000
    assert product_names(p)[: len(p["runs"])] == list(p["runs"])
    assert set(product_names(p)) == set(p["runs"]) | set(p["xr_linear"]) | set(p["hybrids"])


def test_values_are_coerced_in_overrides_too(tmp_path):
    text = (ROOT / "params.yaml").read_text()
    bad = text.replace("  dexml_bow: {method: dexml}\n", "  dexml_bow: {method: dexml, train: {warmup_ratio: 5e-2}}\n", 1)
    assert bad != text
    (tmp_path / "params.yaml").write_text(bad)
    p = load_params(tmp_path / "params.yaml")
    assert p["runs"]["dexml_bow"] == {"method": "dexml", "train": {"warmup_ratio": "5e-2"}}   # YAML reads a string
    assert resolve_run(p, "dexml_bow").config["train"]["warmup_ratio"] == 0.05                 # the run has the float


def test_a_name_that_is_no_run_is_refused_and_a_typo_gets_its_near_miss(tmp_path):
    # a hybrid dropped from hybrids but still named in report.paired is refused (the product's report names only
    # what it writes), and a misspelt run there is named with the nearest run
    params = _product()
    params["runs"]["dexml_bow_wide"] = {"method": "dexml", "encoder": {"dim": 512}}
    load_ok = tmp_path / "ok.yaml"
    load_ok.write_text(yaml.safe_dump(params, sort_keys=False))
    load_params(load_ok)
    params["hybrids"].pop("dexml_bow_hybrid")
    assert any("dexml_bow_hybrid" in pair for pair in params["report"]["paired"])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    with pytest.raises(ConfigError, match="report.paired.[0-9]+: 'dexml_bow_hybrid' is not a run or hybrid"):
        load_params(tmp_path / "params.yaml")
    params["report"]["paired"] = [pair for pair in params["report"]["paired"] if "dexml_bow_hybrid" not in pair]
    params["report"]["paired"].append(["dexml_bow_wid", "dexml_bow"])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    with pytest.raises(ConfigError, match="did you mean 'dexml_bow_wide'"):
        load_params(tmp_path / "params.yaml")


def test_names_that_point_at_runs_must_name_one(tmp_path):
    cases = [("hybrids", {"x_hybrid": {"base": "astr"}}, "hybrids.x_hybrid.base: 'astr' is not a run under runs "
                                                          "(did you mean 'astra'?)"),
             ("registry.promote", ["astra", "xr_linear"], "registry.promote.1: 'xr_linear' is not a packaged run"),
             ("report.training_families", {"f": ["ramenn"]}, "'ramenn' is not a run (did you mean 'ramen'?)"),
             ("xr_linear", {"astra": {}}, "xr_linear.astra: 'astra' is already the name of a run")]
    for dotted, value, message in cases:
        params = _product()
        section, *rest = dotted.split(".")
        if rest:
            params[section][rest[0]] = value
        else:
            params[section] = {**params[section], **value}
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        with pytest.raises(ConfigError) as e:
            load_params(tmp_path / "params.yaml")
        assert message in str(e.value), (dotted, str(e.value))


def test_error_lines_follow_yaml_anchors(tmp_path):
    text = (ROOT / "params.yaml").read_text()
    bad = text.replace("  dexml_bow: {method: dexml}\n",
                       "  dexml_bow: {method: dexml, train: &bow_train {epochs: -5, lr: 0.01}}\n"
                       "  dexml_bow_again: {method: dexml, train: *bow_train}\n", 1)
    assert bad != text
    (tmp_path / "params.yaml").write_text(bad)
    with pytest.raises(ConfigError) as e:
        load_params(tmp_path / "params.yaml")
    anchor_line = 1 + bad[: bad.index("&bow_train")].count("\n")
    # the anchored block is reported where it is written, for each run that uses it
    assert f"params.yaml:{anchor_line}: runs.dexml_bow.train.epochs" in str(e.value)
    assert f"params.yaml:{anchor_line}: runs.dexml_bow_again.train.epochs" in str(e.value)
    lines = yaml_key_lines(bad)
    assert line_of(lines, ("runs", "dexml_bow", "train", "epochs")) == anchor_line
    assert line_of(lines, ("runs", "dexml_bow", "train", "nothing_here")) == anchor_line   # its parent's line


# ------------------------------------------------------------------------------------------------
# runs: a method's defaults file + a run's overrides (xmc.config.runs)
def test_resolve_runs_merges_overrides_onto_the_methods_defaults_file():
    p = load_params(ROOT / "params.yaml")
    specs, problems = resolve_runs({"small": {"method": "astra", "train": {"epochs": 2}, "encoder": {"dim": 16}}}, p)
    assert problems == []
    cfg = specs["small"].config
    d = method_defaults("astra")
    assert cfg["train"]["epochs"] == 2 and cfg["encoder"]["dim"] == 16   # the overrides
    # every other value the defaults file gives, untouched by the override of a sibling key
    assert cfg["train"]["lr"] == d["train"]["lr"] == 0.01 and cfg["train"]["group_lr"] == d["train"]["group_lr"]
    assert cfg["encoder"]["n_buckets"] == d["encoder"]["n_buckets"]
    assert cfg["negatives"]["hard_negatives"] == d["negatives"]["hard_negatives"]
    # keys the defaults file leaves out take the schema's default
    assert cfg["train"]["sparse_optimizer"] == TrainSection().sparse_optimizer
    assert specs["small"].method == "astra" and specs["small"].where == "runs.small"
    # the defaults file itself is what a run with no override resolves to
    bare = resolve_runs({"astra": {"method": "astra"}}, p)[0]["astra"].config
    assert bare == RUN_SCHEMAS["astra"].model_validate(d).model_dump()


def test_a_misspelt_key_is_reported_with_its_run_key_path_and_a_did_you_mean():
    p = load_params(ROOT / "params.yaml")
    specs, problems = resolve_runs({"ok": {"method": "dexml"}, "bad": {"method": "dexml", "negatives": {"shortlist_sise": 9}}},
                                   p, at=("lab", "runs"))
    assert list(specs) == ["ok"]
    assert problems == [(("lab", "runs", "bad", "negatives", "shortlist_sise"),
                         "unknown key (did you mean 'shortlist_size'?)")]
    _, problems = resolve_runs({"bad": {"method": "unidec", "train": {"lr": "fast"}}}, p)
    assert [loc for loc, _ in problems] == [("runs", "bad", "train", "lr")]
    # xmc train's single run: the key path inside the run
    with pytest.raises(ConfigError, match=r"^train\.epochz: unknown key \(did you mean 'epochs'\?\)$"):
        single_run("astra", {"train": {"epochz": 1}}, p)


def test_a_misspelt_run_key_in_params_yaml_is_one_line_with_its_line(tmp_path):
    text = (ROOT / "params.yaml").read_text()
    bad = text.replace("  astra: {method: astra}\n", "  astra: {method: astra, train: {epochz: 3}}\n", 1)
    assert bad != text
    (tmp_path / "params.yaml").write_text(bad)
    with pytest.raises(ConfigError) as e:
        load_params(tmp_path / "params.yaml")
    line = 1 + bad[: bad.index("  astra: {method: astra, train")].count("\n")
    assert str(e.value) == f"{tmp_path / 'params.yaml'}:{line}: runs.astra.train.epochz: unknown key (did you mean 'epochs'?)"


def test_base_chains_resolve_and_cycles_and_unknown_bases_are_one_problem_each():
    p = load_params(ROOT / "params.yaml")
    entries = {"a": {"method": "dexml", "train": {"epochs": 3}}, "b": {"base": "a", "train": {"lr": 0.5}},
               "c": {"base": "b", "encoder": {"dim": 8}}}
    specs, problems = resolve_runs(entries, p)
    assert problems == [] and specs["c"].method == "dexml"
    c = specs["c"].config
    assert (c["train"]["epochs"], c["train"]["lr"], c["encoder"]["dim"]) == (3, 0.5, 8)
    assert specs["b"].config["encoder"]["dim"] == method_defaults("dexml")["encoder"]["dim"]
    # a base may be a run defined elsewhere (the lab's runs on the product's)
    product = resolve_runs(p["runs"], p)[0]
    lab, problems = resolve_runs({"astra_short": {"base": "astra", "train": {"epochs": 1}}}, p, known=product)
    assert problems == [] and lab["astra_short"].config == deep_merge(product["astra"].config, {"train": {"epochs": 1}})
    assert "astra" not in lab   # the known runs are not resolved again
    # a cycle is one problem, with the whole cycle
    _, problems = resolve_runs({"a": {"base": "b"}, "b": {"base": "c"}, "c": {"base": "a"}}, p)
    assert problems == [(("runs", "c", "base"), "runs form a cycle: a -> b -> c -> a")]
    _, problems = resolve_runs({"a": {"base": "a"}}, p)
    assert problems == [(("runs", "a", "base"), "runs form a cycle: a -> a")]
    # a broken base is reported once, where it is defined, not again by the run built on it
    _, problems = resolve_runs({"a": {"method": "dexml", "train": {"epochz": 3}}, "b": {"base": "a"},
                                "c": {"base": "a"}}, p)
    assert problems == [(("runs", "a", "train", "epochz"), "unknown key (did you mean 'epochs'?)")]
    _, problems = resolve_runs({"astra_short": {"base": "astar"}}, p, known=product)
    assert problems == [(("runs", "astra_short", "base"), "'astar' is not a run (did you mean 'astra'?)")]
    _, problems = resolve_runs({"x": {"base": "astra", "method": "dexml"}}, p, known=product)
    assert problems == [(("runs", "x", "method"), "'dexml' differs from its base's ('astra')")]


def test_an_unknown_or_missing_method_is_one_line_with_the_methods():
    p = load_params(ROOT / "params.yaml")
    _, problems = resolve_runs({"a": {"method": "dexm"}}, p)
    (loc, msg), = problems
    assert loc == ("runs", "a", "method") and "unknown method 'dexm' (did you mean 'dexml'?)" in msg
    assert all(m in msg for m in RUN_SCHEMAS)
    _, problems = resolve_runs({"a": {"train": {"epochs": 1}}}, p)
    assert problems[0][0] == ("runs", "a") and "needs method" in problems[0][1]
    _, problems = resolve_runs({"a": ["dexml"]}, p)
    assert problems[0][0] == ("runs", "a") and "mapping" in problems[0][1]
    with pytest.raises(ConfigError, match="unknown method 'astr' \\(did you mean 'astra'\\?\\)"):
        single_run("astr", {}, p)
    with pytest.raises(ConfigError, match="unknown method"):
        method_defaults("nope")
    with pytest.raises(ConfigError, match="no run 'dexml_bo' under runs \\(did you mean 'dexml_bow'\\?\\)"):
        resolve_run(p, "dexml_bo")


def test_st_mnrl_trains_on_the_budget_of_the_dexml_run_it_names():
    p = load_params(ROOT / "params.yaml")
    entries = {"d": {"method": "dexml", "train": {"epochs": 2, "batch_size": 32}},
               "s": {"method": "st_mnrl", "budget_of": "d"}}
    specs, problems = resolve_runs(entries, p)
    assert problems == []
    assert specs["s"].config == {**specs["d"].config, "budget_of": "d"} and specs["s"].method == "st_mnrl"
    for bad, msg in (({"budget_of": "nope"}, "'nope' is not a DEXML run"), ({}, "required key is missing"),
                     ({"budget_of": "d", "train": {"epochs": 3}}, "unknown key")):
        _, problems = resolve_runs({"d": entries["d"], "s": {"method": "st_mnrl", **bad}}, p)
        assert problems and problems[0][0][:2] == ("runs", "s") and msg in problems[0][1], (bad, problems)
    _, problems = resolve_runs({"s": {"method": "st_mnrl", "budget_of": "astra"}}, p,
                               known=resolve_runs(p["runs"], p)[0])
    assert "is not a DEXML run" in problems[0][1]   # an ASTRA run is no budget of the MNRL peer


def test_name_match_reads_the_products_label_names_and_a_run_may_override_them():
    p = load_params(ROOT / "params.yaml")
    assert CONTEXT_SECTIONS["name_match"] == ("label_names",)
    assert resolve_run(p, "name_match").config == {"ranking": "zero_shot", "label_names": p["label_names"]}
    assert resolve_run(p, "name_match_prior").config["ranking"] == "prior"
    uncased = resolve_runs({"u": {"method": "name_match", "label_names": {"cased_names": False}}}, p)[0]["u"].config
    assert uncased["label_names"] == {**p["label_names"], "cased_names": False}


def test_main_knobs_are_the_commented_keys_of_the_defaults_file_in_file_order():
    knobs = dict(main_knobs("dexml"))
    assert list(knobs)[:2] == ["encoder.kind", "encoder.dim"]
    assert knobs["train.epochs"] == "passes over the training data"
    assert "encoder.seed" not in knobs     # an uncommented key is not a main knob
    assert "encoder" not in knobs          # nor a section
    assert dict(main_knobs("maclr"))["stage1.k0"] == "clusters over the whole corpus at the start"
    assert main_knobs("label_prior") == []
    for method in RUN_SCHEMAS:   # every knob is a key the method's run schema has
        for path, comment in main_knobs(method):
            node = RUN_SCHEMAS[method]().model_dump() if method != "st_mnrl" else {"budget_of": None}
            for part in path.split("."):
                assert isinstance(node, dict) and part in node, (method, path)
                node = node[part]
            assert comment, (method, path)


def _leaves(d: dict, prefix: tuple = ()) -> list[tuple[tuple, object]]:
    out = []
    for k, v in d.items():
        out += _leaves(v, (*prefix, k)) if isinstance(v, dict) and v else [((*prefix, k), v)]
    return out


def _at(d: dict, path: tuple):
    for k in path:
        d = d[k]
    return d


def test_every_product_run_resolves_to_exactly_its_defaults_file_and_overrides():
    """No silent drift: each value a run trains with is the one its method's defaults file (or its override in
    params.yaml) gives; a key neither gives is the schema's default."""
    p = load_params(ROOT / "params.yaml")
    specs, problems = resolve_runs(p["runs"], p)
    assert problems == [] and list(specs) == list(p["runs"])
    for name, spec in specs.items():
        entry = dict(p["runs"][name])
        assert spec.method == entry.pop("method")
        defaults = method_defaults(spec.method)
        for section in CONTEXT_SECTIONS.get(spec.method, ()):
            defaults = deep_merge(defaults, {section: deep_merge(p[section], defaults.get(section) or {})})
        given = deep_merge(defaults, entry)
        for path, value in _leaves(given):
            assert _at(spec.config, path) == value, (name, path, _at(spec.config, path), value)
        schema_default = RUN_SCHEMAS[spec.method]().model_dump()
        given_paths = {path for path, _ in _leaves(given)}
        for path, value in _leaves(spec.config):
            if not any(path[: len(g)] == g for g in given_paths):
                assert _at(schema_default, path) == value, (name, path)
    # the shipped defaults are what the product runs train with
    assert specs["dexml_bow"].config["encoder"]["dim"] == method_defaults("dexml")["encoder"]["dim"] == 768
    assert specs["dexml_bow_epochs10"].config["train"]["epochs"] == 10
    assert specs["astra"].config["train"]["epochs"] == method_defaults("astra")["train"]["epochs"]


def test_every_defaults_file_passes_its_methods_schema():
    for method, model in RUN_SCHEMAS.items():
        d = method_defaults(method)
        if method == "st_mnrl":
            assert d == {"budget_of": None}
            continue
        model.model_validate(d)
        assert set(d) <= set(model.model_fields), method


# ------------------------------------------------------------------------------------------------
# builders fill a partial section from the schema
class _Recorder:
    """Stands in for a component class: keeps the keyword arguments a builder passed."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def test_filled_gives_the_schema_defaults_and_keeps_a_full_section():
    assert filled(NegativesConfig, None) == filled(NegativesConfig, {}) == NegativesConfig().model_dump()
    part = filled(NegativesConfig, {"kind": "in_batch", "shortlist_size": "7"})
    assert part == {**NegativesConfig().model_dump(), "kind": "in_batch", "shortlist_size": 7}
    assert filled(NegativesConfig, part) == part


def test_encoder_builder_fills_from_the_schema(monkeypatch):
    from xmc.encoders.build import build_encoder

    monkeypatch.setattr("xmc.encoders.transformer.TransformerEncoder", _Recorder)
    monkeypatch.setattr("xmc.encoders.bow.HashedBagOfWordsEncoder", _Recorder)
    d = EncoderConfig().model_dump()
    assert d["kind"] == "transformer"
    assert build_encoder({}).kwargs == {k: d[k] for k in ("model_dir", "pooling", "max_len_query", "max_len_label",
                                                          "tied", "dropout", "freeze_embeddings", "label_text")}
    bow = build_encoder({"kind": "bow", "dim": "16"}).kwargs
    assert bow == {**{k: d[k] for k in ("n_buckets", "ngram_max", "tied", "dropout", "seed", "label_text")}, "dim": 16}
    assert type(bow["dropout"]) is float


def test_sampler_builder_fills_from_the_schema(monkeypatch):
    from xmc.negatives import build_sampler

    monkeypatch.setattr("xmc.negatives.samplers.HardNegativeShortlist", _Recorder)
    d = NegativesConfig().model_dump()
    assert d["kind"] == "hard"
    Y = sp.csr_matrix(np.eye(6, dtype=np.float32))
    got = build_sampler(Y, {})
    assert got.args[1] == d["max_positives_per_query"]
    want = {k: d[k] for k in ("shortlist_size", "negatives_per_query", "refresh_every_epochs", "refresh_every_steps", "start_epoch",
                              "index_kind", "unsampled_positives", "positive_sampling", "propensity_a", "propensity_b")}
    assert got.kwargs == want
    assert build_sampler(Y, {"shortlist_size": 5}).kwargs == {**want, "shortlist_size": 5}
    assert build_sampler(Y, {"kmeans_iters": 3}).kwargs == {**want, "kmeans_iters": 3}   # passed only when set
    real = build_sampler(Y, {"kind": "in_batch"})   # the other kinds are built for real
    assert real.max_positives_per_query == d["max_positives_per_query"]
    assert real.unsampled_positives == d["unsampled_positives"]


def test_train_config_is_the_schema_train_section():
    from xmc.trainer.trainer import TrainConfig

    d = TrainSection().model_dump()
    fields = [f.name for f in dataclasses.fields(TrainConfig)]
    assert set(fields) <= set(d)
    assert dataclasses.asdict(TrainConfig.from_params({})) == {k: d[k] for k in fields}
    assert TrainConfig() == TrainConfig.from_params({}) == TrainConfig.from_params(None)
    part = TrainConfig.from_params({"lr": "5e-2", "epochs": 3})
    assert part == dataclasses.replace(TrainConfig(), lr=0.05, epochs=3)


def test_index_tfidf_bootstrap_selection_and_monitor_fill_from_the_schema():
    from types import SimpleNamespace

    from xmc.ann import ANNIndex
    from xmc.baselines.tfidf import _vectorizer, fit_tfidf
    from xmc.metrics.bootstrap import bootstrap_settings
    from lab.selection import select_all
    from xmc.trainer.evaluator import RetrievalEvaluator

    d = IndexConfig().model_dump()
    index = ANNIndex.from_params({})
    assert {k: getattr(index, k) for k in ("kind", "hnsw_m", "ef_search", "nprobe")} == \
        {k: d[k] for k in ("kind", "hnsw_m", "ef_search", "nprobe")}
    assert ANNIndex.from_params({"nprobe": 3}).nprobe == 3

    t = TfidfConfig().model_dump()
    assert "token_pattern" not in t and "stop_words" not in t   # optional: scikit-learn's own defaults apply
    v = _vectorizer({}).get_params()
    assert (v["ngram_range"], v["min_df"], v["max_df"], v["max_features"], v["sublinear_tf"]) == \
        ((1, t["ngram_max"]), t["min_df"], t["max_df"], t["max_features"], t["sublinear_tf"])
    feats = fit_tfidf(["a red apple", "a blue car"], None, ["apple fruit", "car vehicle"], {"min_df": 1})
    assert feats.params == {k: x for k, x in t.items() if x is not None}

    assert bootstrap_settings({}) == BootstrapConfig().model_dump()
    assert bootstrap_settings({"evaluate": {"bootstrap": {"seed": "3"}}}) == {**BootstrapConfig().model_dump(),
                                                                              "seed": 3}

    sel = SelectionConfig().model_dump()
    settings = select_all({}, {}, {})["settings"]
    assert (settings["metric"], settings["alpha"]) == (sel["metric"], sel["alpha"])

    ev = EvaluateConfig().model_dump()
    Y = sp.csr_matrix(np.eye(3, dtype=np.float32))
    ds = SimpleNamespace(trn=_Split(["a", "b", "c"], Y), val=_Split(["x", "y", "z"], Y))
    mon, every = RetrievalEvaluator.monitoring(ds, {"eval_every_epochs": 2}, None)
    assert every == 2 and (mon.a, mon.b) == (ev["propensity_a"], ev["propensity_b"])
    assert len(mon.texts) == min(3, TrainSection().val_max_instances)


class _Split:
    def __init__(self, texts, Y):
        self.texts, self.Y = texts, Y

    def __len__(self):
        return len(self.texts)


def _bad_calls(tmp_path):
    """(builder call with a partial section holding one wrong key, the key path its error must name)."""
    from xmc.ann import ANNIndex
    from xmc.baselines.tfidf import fit_tfidf
    from xmc.encoders.build import build_encoder
    from xmc.maclr.train import stage2_pseudo_matrix, train_stage1
    from xmc.metrics.bootstrap import bootstrap_settings
    from xmc.negatives import build_sampler
    from lab.selection import select_all
    from xmc.trainer.evaluator import RetrievalEvaluator
    from xmc.trainer.trainer import TrainConfig
    from xmc.validation import validate_dataset

    Y = sp.csr_matrix(np.eye(4, dtype=np.float32))
    return [
        (lambda: build_encoder({"kind": "bow", "dimm": 8}), "encoder.dimm"),
        (lambda: build_encoder({"kind": "lstm"}), "encoder.kind"),
        (lambda: build_encoder({"kind": "bow", "dim": "wide"}), "encoder.dim"),
        (lambda: build_sampler(Y, {"shortlist_size": "many"}), "negatives.shortlist_size"),
        (lambda: build_sampler(Y, {"shortlist": 10}), "negatives.shortlist"),
        (lambda: TrainConfig.from_params({"lr": "fast"}), "train.lr"),
        (lambda: TrainConfig.from_params({"epochz": 2}), "train.epochz"),
        (lambda: ANNIndex.from_params({"kind": "annoy"}), "index.kind"),
        (lambda: fit_tfidf(["a b"], None, ["a"], {"ngram": 2}), "tfidf.ngram"),
        (lambda: bootstrap_settings({"evaluate": {"bootstrap": {"n_resample": 10}}}), "evaluate.bootstrap.n_resample"),
        (lambda: select_all({"alpha": "often"}, {}, {}), "selection.alpha"),
        (lambda: select_all({"choices": {"c": {"method": "m", "knob": "k", "reference": "5", "default": "5",
                                               "candidates": {"5": "r5", "1": "r1", "2": "r2"},
                                               "seed_study": {"file": "s.json", "sides": {"1": "x", "2": "y"}}}}},
                           {}, {}),
         "selection.choices.c"),
        (lambda: validate_dataset(None, {"max_text_char": 10}), "validate.max_text_char"),
        (lambda: RetrievalEvaluator.monitoring(None, {"eval_every_epoch": 1}, None), "train.eval_every_epoch"),
        (lambda: train_stage1(None, None, {"k0": "many"}, tmp_path), "stage1.k0"),
        (lambda: stage2_pseudo_matrix(None, None, {"selct": "agree"}), "stage2.selct"),
    ]


def test_a_wrong_key_in_a_partial_section_is_a_one_line_config_error(tmp_path):
    for call, key in _bad_calls(tmp_path):
        try:
            call()
        except ConfigError as e:
            msg = str(e)
        else:
            pytest.fail(f"{key}: no ConfigError")
        assert "\n" not in msg and msg.startswith(f"{key}: "), (key, msg)


# ------------------------------------------------------------------------------------------------
# no literal default for a params key outside the schema
SCOPE = ["xmc/encoders", "xmc/negatives", "xmc/losses", "xmc/ann", "xmc/data", "xmc/validation", "xmc/baselines",
         "xmc/graph", "xmc/report", "xmc/metrics", "xmc/maclr", "xmc/peers", "xmc/trainer", "xmc/features",
         "xmc/evaluation.py", "stages", "lab/selection.py", "lab/stages/selection.py"]

# the schema sections each file reads (params sections it is given); a file not named here reads none
SECTIONS_READ = {
    "xmc/encoders/base.py": ["EncoderConfig"],
    "xmc/negatives/samplers.py": ["NegativesConfig"],
    "xmc/ann/index.py": ["IndexConfig"],
    "xmc/baselines/tfidf.py": ["TfidfConfig", "TfidfKnnConfig"],
    "xmc/validation/checks.py": ["ValidateConfig"],
    "xmc/metrics/bootstrap.py": ["ParamsConfig", "EvaluateConfig", "BootstrapConfig"],
    "xmc/maclr/train.py": ["MaclrStage1", "MaclrStage2", "TrainSection", "NegativesConfig", "LossConfig"],
    "xmc/peers/st_mnrl.py": ["DualEncoderConfig", "EncoderConfig", "LossConfig", "TrainSection"],
    "xmc/trainer/trainer.py": ["TrainSection"],
    "xmc/trainer/evaluator.py": ["TrainSection", "EvaluateConfig"],
    "xmc/features/ingest.py": ["DataConfig", "Subsample", "ValidationSplit"],
    "xmc/features/validation.py": ["ParamsConfig", "DataConfig", "ValidateConfig"],
    "xmc/features/tfidf.py": ["ParamsConfig", "TfidfConfig"],
    "xmc/features/graph.py": ["ParamsConfig", "GraphConfig", "WordnetGraph", "DocumentGraph", "WalkConfig"],
    "xmc/features/maclr_pairs.py": ["ParamsConfig", "DataConfig", "MaclrPairs", "TfidfConfig", "LabelNamesConfig"],
    "xmc/evaluation.py": ["ParamsConfig", "EvaluateConfig", "BootstrapConfig"],
    "stages/ingest.py": ["ParamsConfig", "DataConfig"],
    "stages/validate.py": ["ParamsConfig"],
    "stages/tfidf.py": ["ParamsConfig"],
    "stages/graph.py": ["ParamsConfig"],
    "stages/evaluate.py": ["ParamsConfig", "EvaluateConfig"],
    "stages/report.py": ["ParamsConfig", "ReportConfig", "EvaluateConfig"],
    "stages/xr_linear.py": ["ParamsConfig", "XrLinearRunConfig", "EvaluateConfig"],
    "stages/fuse.py": ["ParamsConfig", "HybridEntry"],
    "lab/selection.py": ["SelectionConfig", "SelectionChoice"],
    "lab/stages/selection.py": ["ParamsConfig", "SelectionConfig", "SelectionChoice"],
}

# (file, receiver, key): a .get with a literal default on a key that a section of the file also has, but which
# reads something that is not params
ALLOWED = {
    ("xmc/features/validation.py", "ds.meta", "validation"):
        "data/processed/meta.json (how the validation split was made), not params data.validation",
    ("xmc/features/maclr_pairs.py", "meta", "text_fields"):
        "data/processed/source.json: an xc_raw dataset records no text fields; not params data.text_fields",
}


def _scope_files() -> list[str]:
    out = []
    for entry in SCOPE:
        p = ROOT / entry
        out += [entry] if p.is_file() else sorted(str(f.relative_to(ROOT)) for f in p.rglob("*.py"))
    return out


def _defaulted_fields(names: list[str]) -> set[str]:
    """Fields of these sections that have a default (a required field has none to duplicate)."""
    out = set()
    for name in names:
        model = getattr(schema, name, None) or getattr(lab_config, name)
        out |= {f.alias or k for k, f in model.model_fields.items() if not f.is_required()}
    return out


def _is_literal(node: ast.AST) -> bool:
    ok = (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.UnaryOp, ast.BinOp, ast.operator, ast.unaryop,
          ast.expr_context)
    return all(isinstance(n, ok) for n in ast.walk(node))


def _get_key(node: ast.AST, nargs: int) -> str | None:
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and len(node.args) == nargs and not node.keywords and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        return node.args[0].value
    return None


def _literal_defaults(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, receiver, key) of every ``X.get("key", <literal>)`` and ``X.get("key") or <literal>``."""
    found = []
    for node in ast.walk(tree):
        key = _get_key(node, 2)
        if key is not None and _is_literal(node.args[1]):
            found.append((node.lineno, ast.unparse(node.func.value), key))
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and _is_literal(node.values[-1]):
            for v in node.values[:-1]:
                key = _get_key(v, 1)
                if key is not None:
                    found.append((v.lineno, ast.unparse(v.func.value), key))
    return sorted(found)


def test_the_scan_finds_what_it_must():
    code = ('a = cfg.get("dim", 768)\nb = int(c.get("n_buckets", 1 << 18))\nd = cfg.get("x") or []\n'
            'e = cfg.get("y", len(z))\nf = cfg.get("w")\ng = cfg.get(k, 3)\n')
    assert _literal_defaults(ast.parse(code)) == [(1, "cfg", "dim"), (2, "c", "n_buckets"), (3, "cfg", "x")]


def test_no_literal_default_duplicates_a_schema_default():
    files = _scope_files()
    assert set(SECTIONS_READ) <= set(files), sorted(set(SECTIONS_READ) - set(files))
    assert all(f in SECTIONS_READ for f, _, _ in ALLOWED)
    bad, used = [], set()
    for f in files:
        keys = _defaulted_fields(SECTIONS_READ.get(f, []))
        for line, receiver, key in _literal_defaults(ast.parse((ROOT / f).read_text(encoding="utf-8"))):
            if key not in keys:
                continue
            if (f, receiver, key) in ALLOWED:
                used.add((f, receiver, key))
                continue
            bad.append(f"{f}:{line}: {receiver}.get({key!r}, ...) duplicates the schema's default")
    assert not bad, "\n".join(bad)
    assert used == set(ALLOWED), f"stale ALLOWED entries: {sorted(set(ALLOWED) - used)}"


def test_params_rewritten_by_dvc_exp_run_set_load_with_only_the_override_changed(tmp_path):
    """``dvc exp run -S key=value`` rewrites the whole params.yaml (DVC's YAML 1.2 writer). Read as DVC reads it,
    the file loads and only the overridden value moved."""
    from dvc.utils.hydra import apply_overrides

    path = tmp_path / "params.yaml"
    path.write_text((ROOT / "params.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    apply_overrides(str(path), ["runs.dexml_bow_epochs10.train.epochs=24"])
    before, after = load_params(ROOT / "params.yaml"), load_params(path)
    assert after["runs"]["dexml_bow_epochs10"] == {"method": "dexml", "train": {"epochs": 24}}
    assert resolve_run(after, "dexml_bow_epochs10").config["train"]["epochs"] == 24
    assert [k for k in before if before[k] != after.get(k)] == ["runs"]
    assert {k for k in before["runs"] if before["runs"][k] != after["runs"][k]} == {"dexml_bow_epochs10"}
    after["runs"]["dexml_bow_epochs10"] = before["runs"]["dexml_bow_epochs10"]
    assert after == before


def test_lab_params_rewritten_by_dvc_exp_run_set_keep_their_on_off_strings(tmp_path):
    """The lab's selection choices have values "on" / "off": DVC's rewrite leaves them unquoted. Read with YAML 1.2
    booleans (as DVC reads them) they stay strings; PyYAML's YAML 1.1 booleans would make them True / False."""
    from dvc.utils.hydra import apply_overrides

    from lab.config import load_lab

    path = tmp_path / "params.yaml"
    path.write_text((ROOT / "lab" / "params.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    apply_overrides(str(path), ["selection.alpha=0.01"])
    text = path.read_text(encoding="utf-8")
    assert re.search(r"^\s+reference: on$", text, re.M)   # DVC's rewrite left an unquoted "on" ...
    assert yaml.safe_load(text)["selection"]["choices"]["maclr_label_regularisation"]["reference"] is True   # 1.1
    before = load_lab(ROOT / "lab" / "params.yaml", ROOT / "params.yaml")["lab"]
    after = load_lab(path, ROOT / "params.yaml")["lab"]
    assert after["selection"]["choices"]["maclr_label_regularisation"]["reference"] == "on"
    assert after["selection"]["alpha"] == 0.01
    assert [k for k in before if before[k] != after.get(k)] == ["selection"]
    after["selection"]["alpha"] = before["selection"]["alpha"]
    assert after == before


def test_make_run_dataset_switch_rewrites_only_data_dataset_dir_and_name(tmp_path):
    from xmc.config.use_dataset import main, resolve_dataset, set_dataset_dir

    params = tmp_path / "params.yaml"
    text = ("data:\n  # the folder\n  dataset_dir: ../a/semcor   # a comment kept\n  name: semcor  # outputs\n"
            "  layout: auto\n  validation:\n    name: not-this-one\ngraph:\n  dataset_dir: not-this-one\n")
    params.write_text(text)
    root = tmp_path / "datasets"
    (root / "debian").mkdir(parents=True)
    target = resolve_dataset("debian", root)
    assert set_dataset_dir(params, target) is True
    want = text.replace("../a/semcor", target).replace("name: semcor  #", "name: debian  #")
    assert params.read_text() == want
    assert set_dataset_dir(params, target) is False
    main(["--show-name", "--params", str(params)])
    assert set_dataset_dir(params, target, "debian-2") is True and "name: debian-2  #" in params.read_text()
    set_dataset_dir(params, target)
    assert params.read_text() == want
    with pytest.raises(SystemExit) as e:
        main(["nope", "--root", str(root), "--params", str(params)])
    assert e.value.code == 2 and params.read_text() == want
