"""One run lookup for every method: a run name in ``params.yaml`` -> its method and its settings.

Runs live where their method's settings live (``runs.<name>`` over ``dual_encoder``, ``ramen.runs``,
``unidec.runs``, ``astra.runs``, ``maclr.runs``, ``maclr.fewshot.runs``, ``pretrained.<name>``), plus the
single runs of the peers (``st_mnrl``, ``label_prior``, ``tfidf_zeroshot``, ``tfidf_knn``; the linear peer's runs,
``xr_linear.runs``, train in their own environment and are only checked for clashing names here). A name is
defined once across all of them (the schema refuses a name defined twice), so a stage needs only the name.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from xmc.config.schema import deep_merge
from xmc.errors import ConfigError

# (method, where its runs are in params.yaml, where their defaults are)
RUN_SECTIONS: tuple[tuple[str, tuple[str, ...], tuple[str, ...] | None], ...] = (
    ("dexml", ("runs",), ("dual_encoder",)),
    ("ramen", ("ramen", "runs"), ("ramen", "defaults")),      # the schema merged ramen.defaults onto dual_encoder
    ("unidec", ("unidec", "runs"), ("unidec", "defaults")),
    ("astra", ("astra", "runs"), ("astra", "defaults")),
    ("maclr", ("maclr", "runs"), ("maclr", "defaults")),
    ("maclr_fewshot", ("maclr", "fewshot", "runs"), ("maclr", "fewshot", "defaults")),
    ("pretrained", ("pretrained",), None),
)
PEER_RUNS = ("st_mnrl", "label_prior", "tfidf_zeroshot", "tfidf_knn", "name_match", "name_match_prior",
             "name_match_uncased")
# the label-name retriever's two rankings: no training data at all, and by training sense frequency
NAME_MATCH_RANKING = {"name_match": "zero_shot", "name_match_prior": "prior", "name_match_uncased": "zero_shot"}
# label_names settings a name-match run overrides (selection candidates)
NAME_MATCH_OVERRIDES: dict[str, dict[str, Any]] = {"name_match_uncased": {"cased_names": False}}


@dataclass(frozen=True)
class RunSpec:
    """A run: its name, its method (a key of :data:`xmc.methods.METHODS`) and its merged settings."""

    name: str
    method: str
    config: dict[str, Any] = field(default_factory=dict)
    where: str = ""          # the params key path that defines it, for messages


def _at(params: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = params
    for part in path:
        node = (node or {}).get(part) if isinstance(node, dict) else None
    return node


def _section_runs(params: dict[str, Any]) -> Iterator[tuple[str, str, tuple[str, ...], tuple[str, ...] | None]]:
    for method, runs_path, defaults_path in RUN_SECTIONS:
        for name in _at(params, runs_path) or {}:
            yield name, method, runs_path, defaults_path


def all_runs(params: dict[str, Any]) -> dict[str, str]:
    """Every run name defined in ``params`` -> its method."""
    out = {name: method for name, method, _, _ in _section_runs(params)}
    out.update({name: "label_names" if name in NAME_MATCH_RANKING else name for name in PEER_RUNS})
    return out


def duplicate_runs(params: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Run names defined in more than one place: (name, the key paths)."""
    seen: dict[str, list[str]] = {}
    for name, _, runs_path, _ in _section_runs(params):
        seen.setdefault(name, []).append(".".join((*runs_path, name)))
    for name in PEER_RUNS:
        if name in seen:
            seen[name].append(name)
    for name in (_at(params, ("xr_linear", "runs")) or {}):   # the linear peer's runs (xmc.peers.xr_linear)
        seen.setdefault(name, []).append(f"xr_linear.runs.{name}")
    return [(n, where) for n, where in seen.items() if len(where) > 1]


def find_run(params: dict[str, Any], name: str) -> RunSpec:
    """The run ``name``: its method and its settings (the method's defaults with the run's overrides)."""
    for run, method, runs_path, defaults_path in _section_runs(params):
        if run != name:
            continue
        override = _at(params, runs_path)[name] or {}
        base = _at(params, defaults_path) if defaults_path else {}
        return RunSpec(name, method, deep_merge(base or {}, override), ".".join((*runs_path, name)))
    if name == "st_mnrl":
        # the peer trains on the same budget (encoder, batch, lr, epochs, step cap) as the run it names
        budget = find_run(params, params["st_mnrl"]["budget_of"])
        return RunSpec(name, "st_mnrl", {**budget.config, "budget_of": budget.name}, "st_mnrl")
    if name in ("label_prior", "tfidf_zeroshot", "tfidf_knn"):
        cfg: dict[str, Any] = {} if name == "label_prior" else {"tfidf": params["tfidf"]}
        if name == "tfidf_knn":
            cfg["tfidf_knn"] = params["tfidf_knn"]
        return RunSpec(name, name, cfg, name)
    if name in NAME_MATCH_RANKING:
        return RunSpec(name, "label_names", {"ranking": NAME_MATCH_RANKING[name],
                                             "label_names": {**params["label_names"], **NAME_MATCH_OVERRIDES.get(name, {})}},
                       "label_names")

    known = sorted(all_runs(params))
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"params.yaml: no run {name!r} in any method's runs{hint}")
