"""The lab's ``lab/params.yaml``: its runs, hybrids and linear-peer variants, its reports and the selection choices.

The lab reads the product: its params file (data, features, evaluation, fusion settings), its runs (a lab run may
be ``base: <product run>``) and its outputs. Loading checks every lab run against its method's schema
(:func:`xmc.config.runs.resolve_runs`) with the product's runs known, and reports every problem as one line
``lab/params.yaml:<line>: <key path>: <problem>``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from xmc.config import load_params, problems_error, read_params_file
from xmc.config.runs import resolve_runs
from xmc.config.schema import HybridEntry, Section, XrLinearRunConfig, _check, deep_merge

LAB = Path("lab")
LAB_PARAMS = LAB / "params.yaml"
METRIC_RE = re.compile(r"^(P|nDCG|PSP|PSnDCG|R)@[1-9][0-9]*$")
# keys of a lab run entry that are the lab's, not the method's
LAB_KEYS = ("splits", "spaces", "from_run")
SPACE_SUFFIX = {"concat": "", "de": "_de_only", "clf": "_clf_only"}


class SeedStudy(Section):
    """A choice decided over training seeds: ``file`` is a validation-split JSON of ``lab.bench.seed_study`` and
    ``sides`` maps each candidate value to its side there (``default``: the run as params had it then)."""
    file: str
    sides: Annotated[dict[str, str], Field(min_length=2)]
    part: Literal["run", "hybrid"] = "run"   # the figures compared: the runs' own, or their hybrids' (--hybrid)


class SelectionChoice(Section):
    OPTIONAL = frozenset({"note", "seed_study"})
    method: str
    knob: str
    reference: str
    default: str
    # value -> the run that has it; null: a value no pipeline run has, shown by its seed study alone
    candidates: Annotated[dict[str, str | None], Field(min_length=2)]
    note: str | None = None
    seed_study: SeedStudy | None = None

    @model_validator(mode="after")
    def _values(self) -> SelectionChoice:
        for what in ("reference", "default"):
            v = getattr(self, what)
            if v not in self.candidates:
                raise ValueError(f"{what} {v!r} is not one of the candidates {sorted(self.candidates)}")
        if self.seed_study is not None:
            unknown = sorted(set(self.seed_study.sides) - set(self.candidates))
            if unknown:
                raise ValueError(f"seed_study.sides {unknown} are not candidates {sorted(self.candidates)}")
            if self.reference not in self.seed_study.sides:
                raise ValueError(f"seed_study.sides must include the reference {self.reference!r}")
        runless = sorted(v for v, run in self.candidates.items() if run is None)
        if runless and (self.seed_study is None or set(runless) - set(self.seed_study.sides)):
            raise ValueError(f"candidates {runless} have no run: only a seed study's side can be decided without one")
        if self.candidates.get(self.default) is None:
            raise ValueError(f"the default {self.default!r} needs a run")
        return self


class SelectionConfig(Section):
    metric: str = "P@5"
    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.05
    choices: dict[str, SelectionChoice] = {}

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        if not METRIC_RE.match(v):
            raise ValueError(f"must look like P@5, nDCG@5, PSP@5, PSnDCG@5 or R@100 (got {v!r})")
        return v




class EnsembleFusionConfig(Section):
    """The ensemble hybrid: the member runs' top-k lists ∪ label-name matches under one fusion."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+_hybrid$")] = "ensemble_hybrid"   # its prediction name
    members: list[str] = []            # product runs fused together ([] = no ensemble)


class LabRunEntry(Section):
    """The lab's own keys of a run (the rest are the method's overrides)."""

    splits: Literal["val", "val tst"] = "val"
    spaces: list[Literal["concat", "de", "clf"]] | None = None   # UniDEC: the retrieval spaces predicted
    from_run: str | None = None      # (from_product) the product run whose trained model the run starts from
    from_model: str | None = None    # set when the run only predicts with that model (no method: no training)

    @model_validator(mode="after")
    def _spaces(self) -> LabRunEntry:
        if self.spaces is not None and (not self.spaces or len(set(self.spaces)) != len(self.spaces)):
            raise ValueError(f"spaces must be distinct and not empty (got {self.spaces})")
        return self


class LabReport(Section):
    rows: list[str] = []
    paired: list[Annotated[list[str], Field(min_length=2, max_length=2)]] = []
    ablation_controls: dict[str, str] = {}
    seeds: dict[str, list[str]] = {}


class LabParams(Section):
    runs: dict[str, dict[str, Any]] = {}
    from_product: dict[str, dict[str, Any]] = {}
    hybrids: dict[str, HybridEntry] = {}
    ensemble: EnsembleFusionConfig = EnsembleFusionConfig()
    xr_linear: dict[str, dict[str, Any]] = {}
    report: LabReport = LabReport()
    selection: SelectionConfig = SelectionConfig()


def lab_entry(raw: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the lab's keys, the run entry for :func:`~xmc.config.runs.resolve_runs`) of one lab run."""
    raw = dict(raw or {})
    return {k: raw.pop(k) for k in LAB_KEYS if k in raw}, raw


def prediction_names(name: str, entry: dict[str, Any]) -> list[str]:
    """The predictions a lab run writes: the run's name, or one per UniDEC space of it (of its model's run)."""
    spaces = entry.get("spaces")
    if not spaces:
        return [name]
    stem = entry.get("from_model") or name
    return [f"{stem}{SPACE_SUFFIX[s]}" for s in spaces]


def load_lab(path: str | Path = LAB_PARAMS, product_path: str | Path = "params.yaml") -> dict[str, Any]:
    """The product's params, the lab's and every lab run resolved: {"product", "lab", "specs", "entries"}."""
    product = load_params(product_path)
    raw, lines = read_params_file(path)
    top, problems = _check(LabParams, raw, ())
    if top is None:
        raise problems_error(path, lines, problems)
    lab = top.model_dump()
    product_specs, _ = resolve_runs(product["runs"], product)
    entries: dict[str, dict[str, Any]] = {}
    run_entries: dict[str, dict[str, Any]] = {}
    for section in ("runs", "from_product"):
        for name, raw_entry in lab[section].items():
            own, rest = lab_entry(raw_entry)
            checked, errs = _check(LabRunEntry, own, ())
            problems += [((section, name, *loc), msg) for loc, msg in errs]
            if checked is None:
                continue
            entry = checked.model_dump()
            if name in product["runs"]:
                problems.append(((section, name), f"{name!r} is a product run (lab runs need names of their own)"))
            elif name in entries:
                problems.append(((section, name), f"{name!r} is already a lab run (of runs or from_product)"))
            model = entry["from_run"]
            if (section == "from_product") != (model is not None):
                problems.append(((section, name), "a run of from_product names its product run (from_run: <run>); "
                                 "one of runs does not" if section == "from_product" else
                                 "from_run: is for the runs of from_product"))
                continue
            entries[name] = entry
            if model is not None and model not in product["runs"]:
                problems.append(((section, name, "from_run"), f"{model!r} is not a product run"))
                continue
            if model is not None and "method" not in rest:   # only predicts, with the product's model
                entry["from_model"] = model
                if set(rest) - {"base"}:
                    problems.append(((section, name), "a run predicting with a product model takes no method settings"))
                continue
            if model is not None:   # trains from the product's model (MACLR's few-shot step)
                rest = {**rest, "init": f"models/{model}"}
            run_entries[name] = rest
    specs, run_problems = resolve_runs(run_entries, product, ("runs",), known=product_specs)
    problems += [(("from_product", *loc[1:]) if loc[1:2] and loc[1] in lab["from_product"] else loc, msg)
                 for loc, msg in run_problems]
    for name, cfg in lab["xr_linear"].items():
        _, errs = _check(XrLinearRunConfig, deep_merge(next(iter(product["xr_linear"].values()), {}), cfg or {}), ())
        problems += [(("xr_linear", name, *loc), msg) for loc, msg in errs]
    ens = lab["ensemble"]
    for i, m in enumerate(ens["members"]):
        if m not in product["runs"]:
            problems.append((("ensemble", "members", i), f"{m!r} is not a product run"))
    if ens["members"] and (len(ens["members"]) < 2 or len(set(ens["members"])) != len(ens["members"])):
        problems.append((("ensemble", "members"), "an ensemble fuses two or more distinct runs"))
    if problems:
        raise problems_error(path, lines, problems)
    return {"product": product, "lab": lab, "specs": specs, "entries": entries, "product_specs": product_specs}


__all__ = ["LAB", "LAB_PARAMS", "LabParams", "SelectionConfig", "lab_entry", "load_lab", "prediction_names"]
