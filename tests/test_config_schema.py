"""The params.yaml schema: the shipped file passes, overrides stay partial and typed, and the library's own
fallback defaults agree with the schema's (so a stage and a direct library call build the same thing)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from tests.pipeline_repo import ROOT
from xmc.config import load_params
from xmc.config.schema import EncoderConfig, NegativesConfig, TrainSection, line_of, yaml_key_lines
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


def test_error_lines_follow_yaml_anchors(tmp_path):
    text = (ROOT / "params.yaml").read_text()
    bad = text.replace("  train: &bow_train {epochs: 5,", "  train: &bow_train {epochs: -5,", 1)
    (tmp_path / "params.yaml").write_text(bad)
    with pytest.raises(ConfigError) as e:
        load_params(tmp_path / "params.yaml")
    anchor_line = 1 + bad[: bad.index("&bow_train")].count("\n")
    # the anchored block is reported where it is written, for the section and each run that uses it
    assert f"params.yaml:{anchor_line}: bow_encoder.train.epochs" in str(e.value)
    assert "runs.dexml_bow.train.epochs" in str(e.value)
    lines = yaml_key_lines(bad)
    assert line_of(lines, ("runs", "dexml_bow", "train", "epochs")) == anchor_line


def test_library_fallbacks_agree_with_the_schema():
    from xmc.encoders import build_encoder
    from xmc.negatives import build_sampler
    from xmc.train import TrainConfig

    assert TrainConfig.from_params({}) == TrainConfig.from_params(TrainSection().model_dump())
    bow_partial = build_encoder({"kind": "bow"})
    bow_full = build_encoder(EncoderConfig(kind="bow").model_dump())
    for attr in ("dim", "n_buckets", "ngram_max", "tied"):
        assert getattr(bow_partial, attr) == getattr(bow_full, attr), attr
    Y = sp.csr_matrix(np.eye(6, dtype=np.float32))
    partial, full = build_sampler(Y, {}), build_sampler(Y, NegativesConfig().model_dump())
    assert type(partial) is type(full)
    for attr in ("shortlist_size", "negatives_per_query", "refresh_every_epochs", "start_epoch", "max_positives_per_query",
                 "unsampled_positives"):
        assert getattr(partial, attr) == getattr(full, attr), attr
