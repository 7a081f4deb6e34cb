"""Expectations over the processed dataset.

Each table (train instances, test instances, labels, label pairs) gets an expectation
suite; every expectation carries a GX severity. A failed ``critical`` expectation stops
the pipeline; a failed ``warning`` is reported and the pipeline goes on.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from xmc.config.schema import ValidateConfig, filled
from xmc.data.dataset import XMCDataset

log = logging.getLogger(__name__)


@dataclass
class CheckResult:
    table: str
    expectation: str
    column: str | None
    description: str
    severity: str
    success: bool
    observed: Any = None
    unexpected_count: int | None = None
    unexpected_sample: list[Any] = field(default_factory=list)


@dataclass
class ValidationSummary:
    checks: list[CheckResult]
    label_frequency: dict[str, Any]
    counts: dict[str, Any]
    extra_sections: dict[str, Any] = field(default_factory=dict)

    @property
    def critical_failures(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.success and c.severity == "critical"]

    @property
    def warnings(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.success and c.severity != "critical"]

    def failure_line(self) -> str:
        parts = [f"{c.table}: {c.description} ({c.unexpected_count if c.unexpected_count is not None else c.observed} unexpected)"
                 for c in self.critical_failures]
        return "data validation failed: " + "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "success": not self.critical_failures,
            "metrics": {
                "checks": len(self.checks),
                "passed": sum(c.success for c in self.checks),
                "critical_failures": len(self.critical_failures),
                "warnings": len(self.warnings),
                **{f"labels_{k}": v for k, v in self.label_frequency.items() if isinstance(v, int | float)},
            },
            "counts": self.counts,
            "label_frequency": self.label_frequency,
            "checks": [asdict(c) for c in self.checks],
            "extra_sections": self.extra_sections,
        }


def label_frequency_summary(ds: XMCDataset, head_min_freq: int, tail_max_freq: int) -> dict[str, Any]:
    """Head / torso / tail counts over training frequency, and labels unseen in training."""
    trn_freq = np.asarray(ds.trn.Y.sum(0)).ravel()
    tst_freq = np.asarray(ds.tst.Y.sum(0)).ravel()
    val_freq = np.asarray(ds.val.Y.sum(0)).ravel() if ds.val is not None else np.zeros_like(trn_freq)
    seen = trn_freq > 0
    return {
        "head_min_freq": head_min_freq,
        "tail_max_freq": tail_max_freq,
        "head": int((trn_freq >= head_min_freq).sum()),
        "torso": int(((trn_freq > tail_max_freq) & (trn_freq < head_min_freq)).sum()),
        "tail": int(((trn_freq >= 1) & (trn_freq <= tail_max_freq)).sum()),
        "singletons": int((trn_freq == 1).sum()),
        "unseen_in_train": int((~seen).sum()),
        "test_labels": int((tst_freq > 0).sum()),
        "test_labels_unseen_in_train": int(((tst_freq > 0) & ~seen).sum()),
        "test_pairs_unseen_in_train": int(tst_freq[~seen].sum()),
        "validation_labels": int((val_freq > 0).sum()),
        "validation_labels_unseen_in_train": int(((val_freq > 0) & ~seen).sum()),
        "validation_pairs_unseen_in_train": int(val_freq[~seen].sum()),
        "never_used": int(((trn_freq == 0) & (tst_freq == 0) & (val_freq == 0)).sum()),
        "max_train_freq": int(trn_freq.max()) if trn_freq.size else 0,
        "train_freq_histogram": {
            "bins": ["0", "1", "2-5", "6-20", "21-100", "101-1000", ">1000"],
            "labels": [int(x) for x in np.histogram(trn_freq, bins=[0, 1, 2, 6, 21, 101, 1001, np.inf])[0]],
        },
    }


SPLIT_NAMES = (("trn", "training"), ("val", "validation"), ("tst", "test"))


def _frames(ds: XMCDataset) -> dict[str, pd.DataFrame]:
    frames = {}
    for name in ("trn", "val", "tst"):
        s = ds.split(name)
        frames[name] = pd.DataFrame({
            "uid": list(s.uids),     # memory-mapped columns decoded once, as pandas needs them
            "text": list(s.texts),
            "n_labels": np.diff(s.Y.indptr),
            "group": list(s.groups) if s.groups is not None else [None] * len(s),
        })
    frames["lbl"] = pd.DataFrame({"uid": list(ds.label_uids), "text": list(ds.label_texts)})
    rows = []
    for name in ("trn", "val", "tst"):
        Y = ds.split(name).Y
        rows.append(pd.DataFrame({"split": name, "label_id": Y.indices.astype(np.int64)}))
    frames["pairs"] = pd.concat(rows, ignore_index=True)
    return frames


def _shared(reference: set[Any], column: Any) -> list[Any]:
    """The values of ``reference`` that occur in ``column`` (sorted; missing values left out)."""
    return sorted({v for v in column if v is not None} & reference)


def _suites(ds: XMCDataset, params: dict[str, Any]) -> dict[str, list[tuple[str, Any]]]:
    import great_expectations as gx   # imported here, after GX_ANALYTICS_ENABLED is set: see validate_dataset

    E = gx.expectations
    max_chars, max_label_chars = params["max_text_chars"], params["max_label_chars"]
    counts = ds.meta.get("counts", {})
    suites: dict[str, list[tuple[str, Any]]] = {}
    for name, what in SPLIT_NAMES:
        expected_rows = counts.get(name, {}).get("instances", len(ds.split(name)))
        suites[name] = [
            ("texts are non-empty", E.ExpectColumnValueLengthsToBeBetween(column="text", min_value=1, severity="critical")),
            (f"texts are at most {max_chars} characters",
             E.ExpectColumnValueLengthsToBeBetween(column="text", max_value=max_chars, severity="warning")),
            ("uids are unique", E.ExpectColumnValuesToBeUnique(column="uid", severity="critical")),
            ("row count matches the header / metadata", E.ExpectTableRowCountToEqual(value=int(expected_rows), severity="critical")),
            (f"every {what} instance has at least one label",
             E.ExpectColumnValuesToBeBetween(column="n_labels", min_value=1,
                                             severity="critical" if name == "trn" else "warning")),
        ]
    # "not in the training values": GX copies an expectation's configuration many times per run (2.5 s per
    # expectation at 10^5 training texts, 18 minutes of validation at 10^6), so each set is restricted to the
    # training values that occur in the checked column: values outside it cannot match, so the check, its
    # unexpected count and its examples are the same
    trn_texts = set(ds.trn.texts)
    for name, what in SPLIT_NAMES[1:]:
        suites[name].append((
            f"{what} texts do not also occur in training",
            E.ExpectColumnValuesToNotBeInSet(column="text", value_set=_shared(trn_texts, ds.split(name).texts),
                                             severity="warning"),
        ))
    # a validation split that shares a document with training would leak it (its scores would flatter)
    trn_groups = {g for g in (ds.trn.groups or []) if g is not None}
    if ds.val.groups is not None and trn_groups:
        suites["val"].append((
            "validation documents (groups) do not occur in training",
            E.ExpectColumnValuesToNotBeInSet(column="group", value_set=_shared(trn_groups, ds.val.groups),
                                             severity="critical"),
        ))
    suites["val"].append((
        "uids are disjoint from training",
        E.ExpectColumnValuesToNotBeInSet(column="uid", value_set=_shared(set(ds.trn.uids), ds.val.uids),
                                         severity="critical"),
    ))
    suites["lbl"] = [
        ("label texts are non-empty", E.ExpectColumnValueLengthsToBeBetween(column="text", min_value=1, severity="critical")),
        (f"label texts are at most {max_label_chars} characters",
         E.ExpectColumnValueLengthsToBeBetween(column="text", max_value=max_label_chars, severity="warning")),
        ("label uids are unique", E.ExpectColumnValuesToBeUnique(column="uid", severity="critical")),
        ("label count matches the header / metadata",
         E.ExpectTableRowCountToEqual(value=int(counts.get("n_labels", ds.n_labels)), severity="critical")),
        ("identical label texts are rare (<1%)",
         E.ExpectColumnProportionOfUniqueValuesToBeBetween(column="text", min_value=0.99, severity="warning")),
    ]
    suites["pairs"] = [
        (f"label ids are in [0, {ds.n_labels})",
         E.ExpectColumnValuesToBeBetween(column="label_id", min_value=0, max_value=ds.n_labels - 1, severity="critical")),
    ]
    return suites


def validate_dataset(ds: XMCDataset, params: dict[str, Any] | None) -> ValidationSummary:
    """Run every expectation suite in an ephemeral GX context; never raises on failures. ``params``: the params
    ``validate`` section (partial: the schema's defaults fill the rest)."""
    params = filled(ValidateConfig, params, "validate")
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    # imported here, after that setting: the GX 1.x releases that send analytics read it once, when imported
    import great_expectations as gx

    ctx = gx.get_context(mode="ephemeral")
    source = ctx.data_sources.add_pandas("xmc")
    frames = _frames(ds)
    checks: list[CheckResult] = []
    for table, items in _suites(ds, params).items():
        batch_def = source.add_dataframe_asset(table).add_batch_definition_whole_dataframe("all")
        suite = ctx.suites.add(gx.ExpectationSuite(name=f"xmc_{table}"))
        descriptions = {}
        for desc, exp in items:
            exp = suite.add_expectation(exp)
            descriptions[exp.id] = desc
        vd = ctx.validation_definitions.add(gx.ValidationDefinition(name=f"validate_{table}", data=batch_def, suite=suite))
        result = vd.run(batch_parameters={"dataframe": frames[table]}, result_format="SUMMARY")
        for r in result.results:
            cfg = r.expectation_config
            res = r.result or {}
            sample = res.get("partial_unexpected_list") or []
            checks.append(CheckResult(
                table=table,
                expectation=cfg.type,
                column=cfg.kwargs.get("column"),
                description=descriptions.get(cfg.id, cfg.type),
                severity=str(getattr(cfg.severity, "value", cfg.severity)).lower(),
                success=bool(r.success),
                observed=res.get("observed_value"),
                unexpected_count=res.get("unexpected_count"),
                unexpected_sample=[str(x)[:120] for x in sample[:5]],
            ))
    summary = ValidationSummary(
        checks=checks,
        label_frequency=label_frequency_summary(ds, params["head_min_freq"], params["tail_max_freq"]),
        counts=ds.counts(),
    )
    log.info("validation: %d checks, %d critical failures, %d warnings",
             len(checks), len(summary.critical_failures), len(summary.warnings))
    return summary
