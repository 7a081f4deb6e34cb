"""Choosing settings on the validation split: the paper's setting stays unless beaten significantly.

Each choice (params ``selection.choices``) names the runs that differ only in one knob. The best
candidate on the validation metric is tested against the reference (the paper's setting) with the
paired bootstrap on the validation instances; it replaces the reference only if p < alpha. The
test split is never read here, so test numbers stay an unbiased report of the chosen settings.
"""

from __future__ import annotations

import html
from typing import Any

from lab.config import SelectionConfig
from xmc.config.schema import filled
from xmc.errors import ConfigError
from xmc.metrics.bootstrap import InstanceContributions, paired_bootstrap, paired_over_seeds

SHOWN_METRICS = ["P@1", "P@5", "PSP@5", "R@100"]
RULE = ("the reference (the paper's setting) is kept unless another candidate beats it on the primary metric "
        "with a paired bootstrap p-value below alpha; a choice with a seed study (several training seeds per "
        "candidate) is decided by the paired t-test over the seeds instead")


def _shown(metric: str) -> list[str]:
    return SHOWN_METRICS + ([metric] if metric not in SHOWN_METRICS else [])


def select(
    choice: dict[str, Any],
    val_metrics: dict[str, dict[str, Any]],
    val_contrib: dict[str, InstanceContributions],
    metric: str,
    alpha: float,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    seed_study: dict[str, Any] | None = None,
    val_fingerprint: str | None = None,
    unit: str = "documents",
) -> dict[str, Any]:
    """Decide one choice from validation metrics and contributions (keyed by run name).

    A candidate whose run has no validation metrics is "not run" and the choice is incomplete
    (``chosen`` None); so is a choice whose best or reference run lacks contributions. A choice with
    ``seed_study`` in params is decided from that study (``seed_study``: its JSON, None if not written yet:
    incomplete) by :func:`decide_over_seeds`, if it was measured on this validation split (``val_fingerprint``:
    :func:`xmc.metrics.bootstrap.split_fingerprint` of val_Y); the candidate runs' own figures are still shown.
    """
    # a candidate without a run (None) is a value only the choice's seed study has trained
    cands: dict[str, str | None] = {str(k): (None if v is None else str(v))
                                    for k, v in (choice.get("candidates") or {}).items()}
    ref, default = str(choice.get("reference")), str(choice.get("default"))
    for role, v in (("reference", ref), ("default", default)):
        if v not in cands:
            raise ConfigError(f"selection choice {choice.get('name', '?')!r}: {role} {v!r} is not a candidate "
                              f"({', '.join(cands)})")
    shown = _shown(metric)
    rows = []
    for value, run in cands.items():
        m = val_metrics.get(run) if run is not None else None
        rows.append({"value": value, "run": run,
                     "status": "ok" if m is not None else "not run" if run is not None else "seed study only",
                     "metrics": {k: m.get(k) for k in shown} if m is not None else None,
                     "reference": value == ref, "default": value == default})
    out: dict[str, Any] = {"method": choice.get("method"), "knob": choice.get("knob"), "metric": metric,
                           "reference": ref, "default": default, "note": choice.get("note"), "candidates": rows,
                           "complete": False, "best": None, "best_run": None, "chosen": None, "chosen_run": None,
                           "default_is_chosen": False, "diff": None, "ci95": None, "p_value": None}
    if choice.get("seed_study"):
        return decide_over_seeds(out, choice, seed_study, metric, alpha, level, val_fingerprint)
    not_run = [f"{r['value']} ({r['run']})" for r in rows if r["status"] != "ok"]
    no_metric = [f"{r['value']} ({r['run']})" for r in rows if r["status"] == "ok" and r["metrics"].get(metric) is None]
    if not_run or no_metric:
        out["reason"] = ("incomplete: " + "; ".join(
            ([f"not run on validation: {', '.join(not_run)}"] if not_run else [])
            + ([f"no {metric} in the validation metrics of {', '.join(no_metric)}"] if no_metric else [])))
        return out
    order = {v: i for i, v in enumerate(cands)}
    best = min(cands, key=lambda v: (-float(val_metrics[cands[v]][metric]), v != ref, order[v]))
    out.update(best=best, best_run=cands[best])
    if best == ref:
        out.update(complete=True, chosen=ref, chosen_run=cands[ref], default_is_chosen=default == ref,
                   reason=f"{ref}: the reference has the best {metric} on validation "
                          f"({float(val_metrics[cands[ref]][metric]):.2f}); keep the reference")
        return out
    missing = [cands[v] for v in (best, ref) if cands[v] not in val_contrib]
    if missing:
        out["reason"] = (f"incomplete: no validation contributions for {', '.join(missing)} "
                         "(rerun python -m stages.evaluate <run> --split val)")
        return out
    r = paired_bootstrap(val_contrib[cands[best]], val_contrib[cands[ref]], metric,
                         n_resamples=n_resamples, seed=seed, level=level, unit=unit)
    significant = r["p_value"] < alpha and r["diff"] > 0
    chosen = best if significant else ref
    outcome = (f"p = {r['p_value']:.3f} < {alpha:g}: choose {best}" if significant
               else f"p = {r['p_value']:.3f}: tie, keep the reference")
    out.update(complete=True, chosen=chosen, chosen_run=cands[chosen], default_is_chosen=default == chosen,
               diff=r["diff"], ci95=r["ci95"], p_value=r["p_value"],
               reason=f"{ref}: {best} is {r['diff']:+.2f} {metric} over the reference "
                      f"({100 * level:g} % CI [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]), {outcome}")
    return out


def decide_over_seeds(out: dict[str, Any], choice: dict[str, Any], study: dict[str, Any] | None, metric: str,
                      alpha: float, level: float = 0.95, val_fingerprint: str | None = None) -> dict[str, Any]:
    """The rule over training seeds: the candidate with the best mean ``metric`` over the study's seeds replaces the
    reference only if the paired t-test of their per-seed figures gives p < alpha. ``out`` is :func:`select`'s
    partial result; the study must be of the validation split, and of this one when ``val_fingerprint`` is given
    (another dataset's study leaves the choice incomplete)."""
    spec = choice["seed_study"]
    sides: dict[str, str] = {str(k): str(v) for k, v in spec["sides"].items()}
    ref = out["reference"]
    if study is None:
        out["reason"] = f"incomplete: seed study {spec['file']} not written yet (python -m bench.seed_study)"
        return out
    if study.get("split") != "val":
        raise ConfigError(f"seed study {spec['file']}: split {study.get('split')!r}; choices are made on 'val' only")
    if val_fingerprint is not None and study.get("val_fingerprint") != val_fingerprint:
        out["reason"] = (f"incomplete: seed study {spec['file']} was measured on another validation split "
                         f"({study.get('val_fingerprint')} against this one's {val_fingerprint}); rerun "
                         "python -m bench.seed_study on this data")
        return out
    per_seed = study.get("per_seed", {})
    missing = [f"{v} ({side})" for v, side in sides.items() if side not in per_seed]
    if missing:
        raise ConfigError(f"seed study {spec['file']}: no side {', '.join(missing)} (it has {', '.join(per_seed)})")
    # part "hybrid": each seed's model fused with the name matches (bench.seed_study --hybrid), the figures the
    # choice of a hybrid's base is made on
    part = spec.get("part", "run")
    if part == "hybrid" and any("hybrid" not in r for side in sides.values() for r in per_seed[side]):
        raise ConfigError(f"seed study {spec['file']}: no hybrid figures (run bench.seed_study with --hybrid)")
    figures = {v: [float((r["hybrid"] if part == "hybrid" else r)[metric]) for r in per_seed[side]]
               for v, side in sides.items()}
    seeds = {v: [int(r["seed"]) for r in per_seed[side]] for v, side in sides.items()}
    if len({tuple(x) for x in seeds.values()}) != 1:
        raise ConfigError(f"seed study {spec['file']}: the sides were not trained from the same seeds")
    for row in out["candidates"]:
        if row["value"] in figures:
            row["seed_mean"] = round(sum(figures[row["value"]]) / len(figures[row["value"]]), 2)
    order = {v: i for i, v in enumerate(sides)}
    best = min(sides, key=lambda v: (-sum(figures[v]) / len(figures[v]), v != ref, order[v]))
    n = len(seeds[ref])
    out.update(best=best, best_run=_run_of(out, best), seed_study=spec["file"], n_seeds=n, seed_part=part)
    if best == ref:
        out.update(complete=True, chosen=ref, chosen_run=_run_of(out, ref), default_is_chosen=out["default"] == ref,
                   reason=f"{ref}: the reference has the best mean {metric} over {n} training seeds "
                          f"({sum(figures[ref]) / n:.2f}); keep the reference")
        return out
    r = paired_over_seeds(figures[best], figures[ref], level)
    significant = r["p_value"] < alpha and r["diff"] > 0
    chosen = best if significant else ref
    outcome = (f"p = {r['p_value']:.3f} < {alpha:g}: choose {best}" if significant
               else f"p = {r['p_value']:.3f}: tie, keep the reference")
    out.update(complete=True, chosen=chosen, chosen_run=_run_of(out, chosen), default_is_chosen=out["default"] == chosen,
               diff=r["diff"], ci95=r["ci95"], p_value=r["p_value"],
               reason=f"{ref}: {best} is {r['diff']:+.2f} {metric} over the reference, mean of {n} training seeds "
                      f"({100 * level:g} % t-interval [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]), {outcome} "
                      f"(seed study {spec['file']})")
    return out


def _run_of(out: dict[str, Any], value: str) -> str:
    """The run of candidate ``value`` in :func:`select`'s rows."""
    return next(r["run"] for r in out["candidates"] if r["value"] == value)


def select_all(
    selection: dict[str, Any],
    val_metrics: dict[str, dict[str, Any]],
    val_contrib: dict[str, InstanceContributions],
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    seed_studies: dict[str, dict[str, Any]] | None = None,
    val_fingerprint: str | None = None,
    unit: str = "documents",
) -> dict[str, Any]:
    """Every choice of params ``selection`` (partial: the schema's defaults fill the rest) plus the settings used:
    the content of reports/selection.json."""
    selection = filled(SelectionConfig, selection, "selection")
    metric, alpha = selection["metric"], selection["alpha"]
    choices = []
    for name, choice in selection["choices"].items():
        study = (seed_studies or {}).get(str(choice["seed_study"]["file"])) if choice.get("seed_study") else None
        res = select({**choice, "name": name}, val_metrics, val_contrib, metric, alpha, n_resamples, seed, level,
                     study, val_fingerprint, unit)
        choices.append({"name": str(name), **res})
    return {"settings": {"split": "val", "metric": metric, "alpha": alpha, "n_resamples": n_resamples,
                         "seed": seed, "level": level, "unit": unit, "rule": RULE},
            "choices": choices}


def _header(settings: dict[str, Any]) -> list[str]:
    return [
        f"Choices are made on the validation split (group-disjoint from training), never on the test split. "
        f"Primary metric: {settings['metric']}; alpha = {settings['alpha']:g}. Rule: {RULE} "
        f"(paired bootstrap over the validation {settings.get('unit', 'instances')}, B = {settings['n_resamples']}, "
        f"seed {settings['seed']}).",
        "Final models train on the training split minus validation with the selected settings "
        "(no retraining on train+val).",
    ]


def _agreement(c: dict[str, Any]) -> str:
    if not c["complete"]:
        return f"{c['name']}: no selection yet ({c['reason']})"
    if c["default_is_chosen"]:
        return f"{c['name']}: the default ({c['default']}) agrees with the selection. {c['reason']}."
    return (f"{c['name']}: the default ({c['default']}) disagrees with the selection ({c['chosen']}). "
            f"{c['reason']}.")


def _maclr_line(c: dict[str, Any]) -> str | None:
    info = c.get("val_labels_used")
    if c.get("method") != "maclr" or not info:
        return None
    pairs = f"{info['pairs']} labelled pairs" if info.get("pairs") is not None else "labelled pairs: unknown"
    return (f"MACLR is zero-shot: its selection used the labels of the {info['instances']} validation instances "
            f"({pairs}).")


def _marks(c: dict[str, Any], r: dict[str, Any]) -> list[str]:
    m = []
    if c["chosen"] == r["value"]:
        m.append("chosen")
    if r["default"]:
        m.append("default")
    if r["reference"]:
        m.append("reference")
    if r["status"] != "ok":
        m.append(r["status"])
    if r.get("seed_mean") is not None:
        of = " of the hybrids" if c.get("seed_part") == "hybrid" else ""
        m.append(f"mean {c['metric']}{of} over {c.get('n_seeds')} seeds {r['seed_mean']:.2f}")
    return m


def _by_method(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in report["choices"]:
        groups.setdefault(str(c.get("method") or "other"), []).append(c)
    return groups


def _num(v: Any) -> str:
    return f"{v:.1f}" if isinstance(v, float | int) else "–"


def render_selection_markdown(report: dict[str, Any], title: str = "Settings selected on the validation split") -> str:
    """reports/selection.md: header, then per method a table of every choice's candidates."""
    s = report["settings"]
    shown = _shown(s["metric"])
    lines = [f"## {title}", ""] + [p + "\n" for p in _header(s)]
    if not report["choices"]:
        lines.append("No choices configured (params `selection.choices`).")
    for method, choices in _by_method(report).items():
        lines += [f"### {method}", "", "| choice | knob | candidate | run | " + " | ".join(shown) + " | |",
                  "|" + "---|" * (5 + len(shown))]
        for c in choices:
            for r in c["candidates"]:
                vals = [_num((r["metrics"] or {}).get(k)) for k in shown]
                mk = ", ".join(_marks(c, r))
                cand = f"**{r['value']}**" if c["chosen"] == r["value"] else r["value"]
                lines.append(f"| {c['name']} | {c['knob']} | {cand} | {r['run'] or '–'} | " + " | ".join(vals) + f" | {mk} |")
        lines.append("")
        for c in choices:
            lines.append(f"- {_agreement(c)}")
            if c.get("note"):
                lines.append(f"  Note: {c['note']}")
            ml = _maclr_line(c)
            if ml:
                lines.append(f"  {ml}")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def render_selection_html(report: dict[str, Any], title: str = "Settings selected on the validation split") -> str:
    """reports/selection.html: the same content as the Markdown, self-contained."""
    e = html.escape
    s = report["settings"]
    shown = _shown(s["metric"])
    parts = [f"<p class='note'>{e(p)}</p>" for p in _header(s)]
    if not report["choices"]:
        parts.append("<p>No choices configured (params <code>selection.choices</code>).</p>")
    for method, choices in _by_method(report).items():
        head = "".join(f"<th>{e(h)}</th>" for h in ["choice", "knob", "candidate", "run"] + shown + [""])
        body = ""
        for c in choices:
            for r in c["candidates"]:
                cls = " class='chosen'" if c["chosen"] == r["value"] else ""
                cells = [e(str(c["name"])), e(str(c["knob"])), e(r["value"]), e(r["run"] or "–")]
                cells += [_num((r["metrics"] or {}).get(k)) for k in shown] + [e(", ".join(_marks(c, r)))]
                body += f"<tr{cls}>" + "".join(f"<td>{x}</td>" for x in cells) + "</tr>"
        items = ""
        for c in choices:
            lines = (f"Note: {c['note']}" if c.get("note") else None, _maclr_line(c))
            extra = "".join(f"<br>{e(x)}" for x in lines if x)
            items += f"<li>{e(_agreement(c))}{extra}</li>"
        parts.append(f"<h2>{e(method)}</h2><table><tr>{head}</tr>{body}</table><ul>{items}</ul>")
    css = ("body{font-family:system-ui,sans-serif;margin:2em}table{border-collapse:collapse}"
           "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
           "td:nth-child(-n+4),th:nth-child(-n+4){text-align:left}tr.chosen{background:#eef6ee;font-weight:600}"
           ".note{max-width:60em}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{css}</style></head>"
            f"<body><h1>{e(title)}</h1>{''.join(parts)}</body></html>")
