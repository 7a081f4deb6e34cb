"""A run = a method + overrides of that method's defaults: the one lookup every entry point uses.

Each method's defaults are a commented YAML file in ``xmc/config/defaults/<method>.yaml`` (what ``xmc train
--method M`` trains); a run in a params file is ``name: {method: M, <overrides>}``, or ``{base: <run>, <overrides>}``
for a variant of another run of the same file. Resolution merges the overrides onto the defaults and checks the
result against the method's run schema (:data:`RUN_SCHEMAS`), so a misspelt key is caught with the run's key path.
Nothing here imports a method's code: the training side maps a method name to its class
(:data:`xmc.methods.METHODS`).
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel

from xmc.config.schema import (AstraRunConfig, DualEncoderConfig, FewshotRunConfig, LabelPriorRunConfig, MaclrPairs,
                               MaclrRunConfig, NameMatchRunConfig, PretrainedConfig, RamenRunConfig, StMnrlRunConfig,
                               TfidfKnnConfig, TfidfZeroShotConfig, UnidecRunConfig, _check, deep_merge, filled)
from xmc.errors import ConfigError

# method -> its run schema (the defaults file has the same keys)
RUN_SCHEMAS: dict[str, type[BaseModel]] = {
    "dexml": DualEncoderConfig,
    "maclr": MaclrRunConfig,
    "ramen": RamenRunConfig,
    "unidec": UnidecRunConfig,
    "astra": AstraRunConfig,
    "maclr_fewshot": FewshotRunConfig,
    "pretrained": PretrainedConfig,
    "st_mnrl": StMnrlRunConfig,
    "label_prior": LabelPriorRunConfig,
    "tfidf_zeroshot": TfidfZeroShotConfig,
    "tfidf_knn": TfidfKnnConfig,
    "name_match": NameMatchRunConfig,
}
# what each method is, in a line (``xmc train --help``)
DESCRIPTIONS: dict[str, str] = {
    "dexml": "DEXML: dual encoder, DecoupledSoftmax over ANN-mined hard negatives",
    "maclr": "MACLR: zero-shot pre-training from raw text (clustering, label regularisation, pseudo pairs)",
    "ramen": "RAMEN: dual encoder regularised by the label and document graphs",
    "unidec": "UniDEC: dual-encoder head + per-label classifier head, pick-some-labels batches",
    "astra": "ASTRA: encoder + one-vs-all classifiers, negatives from an ANN index over the classifiers",
    "maclr_fewshot": "MACLR's few-shot step: a trained encoder fine-tuned on the pairs of a few labels",
    "pretrained": "an encoder off the shelf (all-MiniLM-L6-v2), not trained",
    "st_mnrl": "sentence-transformers' trainer with MultipleNegativesRankingLoss (a peer)",
    "label_prior": "the most frequent training labels (a baseline)",
    "tfidf_zeroshot": "TF-IDF cosine between text and label text (a zero-shot baseline)",
    "tfidf_knn": "labels of the nearest TF-IDF training neighbours (a baseline)",
    "name_match": "the labels whose names occur in the text (the label-name retriever)",
}
# product sections a method's config carries under the same key (a run may override them for itself)
CONTEXT_SECTIONS: dict[str, tuple[str, ...]] = {"name_match": ("label_names",)}
# keys of a run entry that are not overrides of the method's settings
ENTRY_KEYS = ("method", "base")
# the methods of the five papers, the ones ``xmc train --help`` lists first
PAPER_METHODS = ("dexml", "maclr", "ramen", "unidec", "astra")


@dataclass(frozen=True)
class RunSpec:
    """A run: its name, its method and its merged, checked settings."""

    name: str
    method: str
    config: dict[str, Any] = field(default_factory=dict)
    where: str = ""          # the params key path that defines it, for messages


@functools.lru_cache(maxsize=None)
def _defaults_text(method: str) -> str:
    return (resources.files("xmc.config") / "defaults" / f"{method}.yaml").read_text(encoding="utf-8")


def method_defaults(method: str) -> dict[str, Any]:
    """The defaults of ``method`` as its YAML file gives them (partial: the schema fills the rest)."""
    if method not in RUN_SCHEMAS:
        raise ConfigError(f"unknown method {method!r} (have: {', '.join(RUN_SCHEMAS)})")
    data = yaml.safe_load(_defaults_text(method)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"xmc/config/defaults/{method}.yaml: not a mapping")
    return data


def main_knobs(method: str) -> list[tuple[str, str]]:
    """(key path, its comment) of the commented knobs in the method's defaults file, in file order."""
    out: list[tuple[str, str]] = []
    stack: list[tuple[int, str]] = []
    for line in _defaults_text(method).splitlines():
        body = line.split("#", 1)[0].rstrip()
        if not body.strip() or ":" not in body:
            continue
        indent = len(line) - len(line.lstrip())
        key = body.strip().split(":", 1)[0].strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key])
        if "#" in line and not line.lstrip().startswith("#"):
            out.append((path, line.split("#", 1)[1].strip()))
        if body.rstrip().endswith(":"):
            stack.append((indent, key))
    return out


def _problem(where: tuple[Any, ...], msg: str) -> tuple[tuple[Any, ...], str]:
    return where, msg


def resolve_runs(entries: dict[str, Any], params: dict[str, Any], at: tuple[str, ...] = ("runs",),
                 known: dict[str, RunSpec] | None = None) -> tuple[dict[str, RunSpec], list]:
    """Every entry of ``entries`` resolved: ({name: RunSpec}, [(key path, problem)]). ``known`` are runs defined
    elsewhere that a ``base:`` may name (the product's runs, for the lab)."""
    specs: dict[str, RunSpec] = {}
    problems: list[tuple[tuple[Any, ...], str]] = []
    known = dict(known or {})

    failed: set[str] = set()   # entries already reported: a run named as a base by several is reported once

    def resolve(name: str, chain: tuple[str, ...]) -> RunSpec | None:
        if name in specs:
            return specs[name]
        if name in failed:
            return None
        if name not in entries:
            return known.get(name)
        spec = resolve_entry(name, chain)
        if spec is None:
            failed.add(name)
        return spec

    def resolve_entry(name: str, chain: tuple[str, ...]) -> RunSpec | None:
        entry = entries[name] or {}
        where = (*at, name)
        if not isinstance(entry, dict):
            problems.append(_problem(where, "a run is a mapping {method: <method>, <overrides>}"))
            return None
        overrides = {k: v for k, v in entry.items() if k not in ENTRY_KEYS}
        base_name = entry.get("base")
        base: RunSpec | None = None
        if base_name is not None:
            if base_name in (*chain, name):
                problems.append(_problem((*where, "base"),
                                         f"runs form a cycle: {' -> '.join((*chain, name, str(base_name)))}"))
                return None
            base = resolve(str(base_name), (*chain, name))
            if base is None and base_name in entries:
                return None   # the base's own problem is reported where it is defined
            if base is None:
                pool = sorted(set(entries) | set(known))
                close = difflib.get_close_matches(str(base_name), pool, n=1)
                problems.append(_problem((*where, "base"), f"{base_name!r} is not a run" +
                                         (f" (did you mean {close[0]!r}?)" if close else "")))
                return None
        method = entry.get("method", base.method if base else None)
        if method is None:
            problems.append(_problem(where, "needs method: <one of " + ", ".join(RUN_SCHEMAS) + "> (or base: <run>)"))
            return None
        if method not in RUN_SCHEMAS:
            close = difflib.get_close_matches(str(method), list(RUN_SCHEMAS), n=1)
            problems.append(_problem((*where, "method"), f"unknown method {method!r}" +
                                     (f" (did you mean {close[0]!r}?)" if close else "") +
                                     f"; have: {', '.join(RUN_SCHEMAS)}"))
            return None
        if base is not None and base.method != method:
            problems.append(_problem((*where, "method"), f"{method!r} differs from its base's ({base.method!r})"))
            return None
        if method == "st_mnrl":
            return _resolve_st_mnrl(name, overrides, where, resolve, chain, specs, problems)
        if base is not None:
            start = base.config
        else:
            start = method_defaults(method)
            for section in CONTEXT_SECTIONS.get(method, ()):
                start = deep_merge(start, {section: deep_merge(params.get(section) or {}, start.get(section) or {})})
        merged = deep_merge(start, overrides)
        validated, errs = _check(RUN_SCHEMAS[method], merged, ())
        if validated is None:
            for loc, msg in errs:
                problems.append(_problem((*where, *loc), msg))
            return None
        config = validated.model_dump()
        crossed = _cross_checks(method, config, params)
        if crossed:
            problems.extend(_problem((*where, *loc), msg) for loc, msg in crossed)
            return None
        spec = RunSpec(name, method, config, ".".join(where))
        specs[name] = spec
        return spec

    for name in entries:
        resolve(name, ())
    return {n: specs[n] for n in entries if n in specs}, problems


def _cross_checks(method: str, config: dict[str, Any], params: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    """What a run's schema cannot check alone: MACLR's Stage II takes at most the labels the pseudo-pairs stage
    mines per instance (params ``maclr_pairs``); a few-shot run names the encoder it starts from."""
    out: list[tuple[tuple[Any, ...], str]] = []
    if method == "maclr":
        s2 = config["stage2"]
        key = {"tfidf": "tfidf_k", "label_names": "names_k"}[s2["sparse_view"]]
        mined = filled(MaclrPairs, params.get("maclr_pairs"), "maclr_pairs")[key]
        if s2["sparse"] and s2["sparse_k"] > mined:
            out.append((("stage2", "sparse_k"), f"{s2['sparse_k']} exceeds maclr_pairs.{key} ({mined}): only that "
                                               f"many {s2['sparse_view']} labels are mined per instance"))
    if method == "maclr_fewshot" and not config.get("init"):
        out.append((("init",), "required: the encoder folder the run starts from (a trained model, e.g. models/maclr)"))
    return out


def _resolve_st_mnrl(name: str, overrides: dict[str, Any], where: tuple[Any, ...], resolve: Any,
                     chain: tuple[str, ...], specs: dict[str, RunSpec], problems: list) -> RunSpec | None:
    """The MNRL peer trains on the budget (encoder, batch, lr, epochs, step cap) of the run it names."""
    validated, errs = _check(StMnrlRunConfig, overrides, ())
    if validated is None:
        problems.extend(_problem((*where, *loc), msg) for loc, msg in errs)
        return None
    budget_of = validated.budget_of
    budget = resolve(budget_of, (*chain, name)) if budget_of != name else None
    if budget is None or budget.method != "dexml":
        problems.append(_problem((*where, "budget_of"), f"{budget_of!r} is not a DEXML run of this file"))
        return None
    spec = RunSpec(name, "st_mnrl", {**budget.config, "budget_of": budget.name}, ".".join(where))
    specs[name] = spec
    return spec


def resolve_run(params: dict[str, Any], name: str) -> RunSpec:
    """The run ``name`` of a loaded params file (``runs``), or a one-line error naming the nearest run."""
    specs, problems = resolve_runs(params.get("runs") or {}, params)
    if name in specs:
        return specs[name]
    if problems:
        loc, msg = problems[0]
        raise ConfigError(f"params.yaml: {'.'.join(map(str, loc))}: {msg}")
    close = difflib.get_close_matches(name, list(specs), n=1)
    raise ConfigError(f"params.yaml: no run {name!r} under runs" + (f" (did you mean {close[0]!r}?)" if close else ""))


def single_run(method: str, overrides: dict[str, Any] | None, params: dict[str, Any], name: str | None = None,
               where: str = "overrides") -> RunSpec:
    """One run of ``method`` with ``overrides`` (``xmc train``): a problem is one ConfigError line."""
    if method not in RUN_SCHEMAS:
        close = difflib.get_close_matches(str(method), list(RUN_SCHEMAS), n=1)
        raise ConfigError(f"unknown method {method!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                          + f"; have: {', '.join(RUN_SCHEMAS)}")
    name = name or method
    specs, problems = resolve_runs({name: {"method": method, **(overrides or {})}}, params, (where,))
    if problems:
        raise ConfigError("; ".join(f"{'.'.join(map(str, loc[2:] if loc[:2] == (where, name) else loc))}: {msg}"
                                    for loc, msg in problems))
    return specs[name]


__all__ = ["DESCRIPTIONS", "PAPER_METHODS", "RUN_SCHEMAS", "RunSpec", "main_knobs", "method_defaults", "resolve_run",
           "resolve_runs", "single_run"]
