"""``params.yaml`` read and checked: the schema (:mod:`xmc.config.schema`), every run resolved against its
method's defaults (:mod:`xmc.config.runs`), the names that point at runs checked, and each problem reported as
one line ``params.yaml:<line>: <key path>: <problem>``."""

from __future__ import annotations

import difflib
from typing import Any

from xmc.config.runs import resolve_runs
from xmc.config.schema import ParamsConfig, ParamsError, _check


def validate_params(raw: Any) -> dict[str, Any]:
    """``params.yaml`` (parsed) -> the same tree, typed and with defaults filled, every run resolved against its
    method's defaults (:func:`xmc.config.runs.resolve_runs`); :class:`ParamsError` listing every problem if not."""
    if not isinstance(raw, dict):
        raise ParamsError([((), "the file must be a mapping of sections (data:, runs:, ...)")])
    top, problems = _check(ParamsConfig, raw, ())
    if top is None:
        raise ParamsError(problems)
    p = top.model_dump(by_alias=True)
    _, run_problems = resolve_runs(p["runs"], p, ("runs",))
    problems += run_problems
    problems += product_references(p)
    if problems:
        raise ParamsError(problems)
    return p


def product_names(p: dict[str, Any]) -> list[str]:
    """Every prediction the product pipeline writes, in report order: the runs, the linear peer's, the hybrids."""
    return [*p["runs"], *p["xr_linear"], *p["hybrids"]]


def product_references(p: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    """Names must be distinct, and names that point at runs must name one: a hybrid's base, the paired tests, the
    training figures and the packages the registry promotes."""
    out: list[tuple[tuple[Any, ...], str]] = []
    runs = set(p["runs"])
    names = product_names(p)
    taken = set(p["runs"])
    for name in p["xr_linear"]:
        if name in taken:
            out.append((("xr_linear", name), f"{name!r} is already the name of a run"))
    taken |= set(p["xr_linear"])

    def near(name: str, pool: set[str] | list[str]) -> str:
        close = difflib.get_close_matches(str(name), sorted(pool), n=1, cutoff=0.6)
        return f" (did you mean {close[0]!r}?)" if close else ""

    for name, h in p["hybrids"].items():
        if name in taken:
            out.append((("hybrids", name), f"{name!r} is already the name of a run"))
        if h["base"] not in runs:
            out.append((("hybrids", name, "base"), f"{h['base']!r} is not a run under runs{near(h['base'], runs)}"))
    for i, pair in enumerate(p["report"]["paired"]):
        for name in pair:
            if name not in names:
                out.append((("report", "paired", i), f"{name!r} is not a run or hybrid of this file{near(name, names)}"))
    for title, fam in p["report"]["training_families"].items():
        for name in fam:
            if name not in runs:
                out.append((("report", "training_families", title), f"{name!r} is not a run{near(name, runs)}"))
    for i, name in enumerate(p["registry"]["promote"]):
        if name not in names or name in p["xr_linear"]:
            out.append((("registry", "promote", i), f"{name!r} is not a packaged run or hybrid{near(name, names)}"))
    return out
