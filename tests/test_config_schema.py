"""The params.yaml schema: the shipped file passes, overrides stay partial and typed, and the schema is the only
place a params default lives: a library builder given a partial section fills it from the schema (so a stage and a
direct library call build the same thing), and no ``.get("<key>", <literal>)`` duplicates a schema default."""

from __future__ import annotations

import ast
import dataclasses
import re

import numpy as np
import pytest
import scipy.sparse as sp

from tests.pipeline_repo import ROOT
from xmc.config import load_params
from xmc.config import schema
from xmc.config.schema import (
    BootstrapConfig,
    EncoderConfig,
    EvaluateConfig,
    IndexConfig,
    NegativesConfig,
    SelectionConfig,
    TfidfConfig,
    TrainSection,
    filled,
    line_of,
    yaml_key_lines,
)
from xmc.errors import ConfigError


def test_shipped_params_pass_and_get_every_default():
    p = load_params(ROOT / "params.yaml")
    assert p["dual_encoder"]["train"]["schedule"] == "linear" and p["dual_encoder"]["train"]["device"] == "auto"
    # overrides stay partial: merging them onto the method's defaults is the stages' job
    assert p["ramen"]["runs"]["ramen_seed1"] == {"encoder": {"seed": 1}, "train": {"seed": 1}}
    # a loss's unset hyperparameters are left to the loss class
    assert p["dual_encoder"]["loss"] == {"name": "decoupled_softmax", "temperature": 0.05}


def test_values_are_coerced_in_overrides_too(tmp_path):
    text = (ROOT / "params.yaml").read_text().replace("  dexml: {}\n", "  dexml: {train: {warmup_ratio: 5e-2}}\n", 1)
    (tmp_path / "params.yaml").write_text(text)
    p = load_params(tmp_path / "params.yaml")
    assert p["runs"]["dexml"] == {"train": {"warmup_ratio": 0.05}}  # YAML reads 5e-2 as a string


def test_a_narrowed_hybrid_is_no_near_miss_of_a_run_but_a_typo_still_is(tmp_path):
    # an experiment that drops dexml_bow from hybrid.runs leaves dexml_bow_hybrid in report.paired: a removed row,
    # not a typo, though it is within the near-miss distance of a run named dexml_bow_wide (a candidate of round 19)
    import yaml

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["runs"]["dexml_bow_wide"] = {"encoder": {"dim": 512}}
    params["hybrid"]["runs"] = {r: base for r, base in params["hybrid"]["runs"].items() if r != "dexml_bow"}
    params["methods"] = [m for m in params["methods"] if m != "dexml_bow_hybrid"]   # the main report must name runs
    params["packages"] = [k for k in params["packages"] if k != "dexml_bow_hybrid"]
    params["registry"]["promote"] = [k for k in params["registry"]["promote"] if k != "dexml_bow_hybrid"]
    assert any("dexml_bow_hybrid" in pair for pair in params["report"]["paired"])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    load_params(tmp_path / "params.yaml")
    params["report"]["paired"].append(["dexml_bow_wid", "dexml_bow"])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    with pytest.raises(ConfigError, match="did you mean 'dexml_bow_wide'"):
        load_params(tmp_path / "params.yaml")


def test_error_lines_follow_yaml_anchors(tmp_path):
    text = (ROOT / "params.yaml").read_text()
    bad = re.sub(r"(  train: &bow_train \{epochs: )\d+,", r"\g<1>-5,", text, count=1)
    assert bad != text   # the anchored block is still written as the test expects
    (tmp_path / "params.yaml").write_text(bad)
    with pytest.raises(ConfigError) as e:
        load_params(tmp_path / "params.yaml")
    anchor_line = 1 + bad[: bad.index("&bow_train")].count("\n")
    # the anchored block is reported where it is written, for the section and each run that uses it
    assert f"params.yaml:{anchor_line}: bow_encoder.train.epochs" in str(e.value)
    assert "runs.dexml_bow.train.epochs" in str(e.value)
    lines = yaml_key_lines(bad)
    assert line_of(lines, ("runs", "dexml_bow", "train", "epochs")) == anchor_line


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
    from xmc.encoders import build_encoder

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
    from xmc.trainer import TrainConfig

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
    from xmc.report.selection import select_all
    from xmc.trainer import RetrievalEvaluator

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
    from xmc.encoders import build_encoder
    from xmc.maclr.train import stage2_pseudo_matrix, train_stage1
    from xmc.metrics.bootstrap import bootstrap_settings
    from xmc.negatives import build_sampler
    from xmc.report.selection import select_all
    from xmc.trainer import RetrievalEvaluator, TrainConfig
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
         "xmc/graph", "xmc/report", "xmc/metrics", "xmc/maclr", "xmc/peers", "xmc/trainer",
         "stages/ingest.py", "stages/validate.py", "stages/tfidf.py", "stages/graph.py", "stages/evaluate.py",
         "stages/report.py", "stages/selection.py", "stages/maclr_pseudo_pairs.py"]

# the schema sections each file reads (params sections it is given); a file not named here reads none
SECTIONS_READ = {
    "xmc/encoders/base.py": ["EncoderConfig"],
    "xmc/negatives/samplers.py": ["NegativesConfig"],
    "xmc/ann/index.py": ["IndexConfig"],
    "xmc/baselines/tfidf.py": ["TfidfConfig", "TfidfKnnConfig"],
    "xmc/validation/checks.py": ["ValidateConfig"],
    "xmc/metrics/bootstrap.py": ["ParamsConfig", "EvaluateConfig", "BootstrapConfig"],
    "xmc/report/selection.py": ["SelectionConfig", "SelectionChoice"],
    "xmc/maclr/train.py": ["MaclrStage1", "MaclrStage2", "TrainSection", "NegativesConfig", "LossConfig"],
    "xmc/peers/st_mnrl.py": ["DualEncoderConfig", "EncoderConfig", "LossConfig", "TrainSection"],
    "xmc/trainer/trainer.py": ["TrainSection"],
    "xmc/trainer/evaluator.py": ["TrainSection", "EvaluateConfig"],
    "stages/ingest.py": ["ParamsConfig", "DataConfig", "Subsample", "ValidationSplit"],
    "stages/validate.py": ["ParamsConfig", "DataConfig", "ValidateConfig"],
    "stages/tfidf.py": ["ParamsConfig", "DataConfig", "TfidfConfig"],
    "stages/graph.py": ["ParamsConfig", "DataConfig", "RamenConfig", "GraphConfig", "WordnetGraph", "DocumentGraph",
                        "WalkConfig", "ValidateConfig"],
    "stages/evaluate.py": ["ParamsConfig", "DataConfig", "EvaluateConfig", "BootstrapConfig"],
    "stages/report.py": ["ParamsConfig", "ReportConfig", "EvaluateConfig"],
    "stages/selection.py": ["ParamsConfig", "DataConfig", "SelectionConfig", "SelectionChoice"],
    "stages/maclr_pseudo_pairs.py": ["ParamsConfig", "DataConfig", "MaclrConfig", "MaclrPairs", "TfidfConfig"],
}

# (file, receiver, key): a .get with a literal default on a key that a section of the file also has, but which
# reads something that is not params
ALLOWED = {
    ("stages/validate.py", "ds.meta", "validation"):
        "data/processed/meta.json (how the validation split was made), not params data.validation",
    ("stages/maclr_pseudo_pairs.py", "meta", "text_fields"):
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
        model = getattr(schema, name)
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
    """``dvc exp run -S key=value`` rewrites the whole params.yaml (DVC's YAML 1.2 writer): strings such as a
    selection choice's "on" / "off" come out unquoted. Read as DVC reads them (YAML 1.2 booleans), the file loads
    and only the overridden value moved; PyYAML's YAML 1.1 booleans would make them True / False."""
    import yaml
    from dvc.utils.hydra import apply_overrides

    path = tmp_path / "params.yaml"
    path.write_text((ROOT / "params.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    apply_overrides(str(path), ["astra.defaults.train.epochs=24"])
    text = path.read_text(encoding="utf-8")
    assert re.search(r"^\s+reference: on$", text, re.M)   # DVC's rewrite left an unquoted "on" ...
    assert yaml.safe_load(text)["selection"]["choices"]["maclr_label_regularisation"]["reference"] is True   # 1.1
    before, after = load_params(ROOT / "params.yaml"), load_params(path)
    assert after["selection"]["choices"]["maclr_label_regularisation"]["reference"] == "on"
    assert after["astra"]["defaults"]["train"]["epochs"] == 24
    assert [k for k in before if before[k] != after.get(k)] == ["astra"]
    after["astra"]["defaults"]["train"]["epochs"] = before["astra"]["defaults"]["train"]["epochs"]
    assert after == before
