"""The model card of a package (``README.md`` next to its manifest): what the model is, what it was trained on,
with which settings, how well it does, and how to use it. Written from the manifest, so the two never disagree."""

from __future__ import annotations

import json
from typing import Any

CARD = "README.md"
CARD_METRICS = ("P@1", "P@3", "P@5", "nDCG@5", "PSP@5", "R@10", "R@100", "unseen_R@100")
METHOD_NOTES = {
    "dexml": "a dual encoder trained with DecoupledSoftmax over many negatives (DEXML)",
    "maclr": "a dual encoder pre-trained without labelled pairs (MACLR: ICT pseudo pairs, multi-scale clustering, "
             "label regularisation, self-training on pseudo pairs)",
    "maclr_fewshot": "a MACLR (or off-the-shelf) encoder fine-tuned on a few labels' pairs",
    "ramen": "a dual encoder regularised by graph metadata during training (RAMEN); no graph at inference",
    "unidec": "a dual encoder and per-label classifiers trained together (UniDEC)",
    "astra": "per-label classifiers over a trained encoder, trained with ANN and uniform negatives (ASTRA)",
    "pretrained": "an off-the-shelf sentence encoder, not trained here",
    "st_mnrl": "a sentence-transformers MultipleNegativesRankingLoss fine-tune (peer)",
    "ensemble": "an ensemble of several trained runs, each searched for its own top-k list",
}


def _table(metrics: dict[str, Any]) -> list[str]:
    splits = [s for s in ("val", "tst") if metrics.get(s)]
    if not splits:
        return ["No metrics recorded."]
    names = {"val": "validation", "tst": "test"}
    lines = ["| split | " + " | ".join(CARD_METRICS) + " |", "|" + "---|" * (len(CARD_METRICS) + 1)]
    for s in splits:
        m = metrics[s]
        cells = [f"{m[k]:.1f}" if isinstance(m.get(k), int | float) else "–" for k in CARD_METRICS]
        lines.append(f"| {names[s]} ({m.get('n_test', '?')} instances) | " + " | ".join(cells) + " |")
    return lines


def training_record(summary: dict[str, Any]) -> dict[str, Any]:
    """What a package manifest keeps of a training summary: the fields ``training_budget`` reads (per-stage step
    counts and the machine's name for two-stage MACLR), not the whole record."""
    rec = {k: summary[k] for k in ("train_seconds", "epochs", "steps", "device") if k in summary}
    for key in ("stage1", "stage2"):
        if isinstance(summary.get(key), dict) and "steps" in summary[key]:
            rec[key] = {"steps": summary[key]["steps"]}
    machine = summary.get("machine") or {}
    if machine.get("cpu"):
        rec["machine"] = {k: machine[k] for k in ("cpu", "cores") if k in machine}
    return rec


def training_budget(summary: dict[str, Any]) -> str:
    """The card's training line ("6 epochs, 330 steps, 35.58 s on cpu") from a training summary. MACLR trains in
    two stages, each with its own step count, and records the machine but no device: the line reads those instead
    of showing "?"."""
    stages = [(label, summary[key]) for key, label in (("stage1", "Stage I"), ("stage2", "Stage II"))
              if isinstance(summary.get(key), dict)]
    if stages:
        parts = [f"{label} {st.get('steps', '?')} steps" for label, st in stages]
    else:
        parts = [f"{summary[k]} {k}" for k in ("epochs", "steps") if k in summary]
    parts.append(f"{summary.get('train_seconds', '?')} s")
    device = summary.get("device")
    if device is None:
        machine = summary.get("machine") or {}
        device = f"{machine['cpu']} ({machine.get('cores', '?')} cores)" if machine.get("cpu") else None
    # an ensemble records only the sum of its members' seconds: say no more than that
    return ", ".join(parts) + (f" on {device}" if device else " of training")


def model_card(manifest: dict[str, Any]) -> str:
    """Markdown card of one package from its manifest (before the ``files`` section is added)."""
    name, method = manifest["name"], manifest["method"]
    ds, tr, params = manifest.get("dataset") or {}, manifest.get("training") or {}, manifest.get("params") or {}
    pred = manifest.get("predictor") or {}
    what = METHOD_NOTES.get(method, f"the {method} method")
    members = [m.get("name") for m in pred.get("members") or []]
    hybrid = "" if pred.get("kind") != "hybrid" else (
        f" Candidates are the top-k lists of {', '.join(f'`{m}`' for m in members)} united with the labels named in "
        "the text, re-scored by one fusion of every member's score fit on the validation split." if members else
        " Candidates are the model's ANN list united with the labels named in the text, re-scored by a fusion "
        "fit on the validation split.")
    settings = {k: v for k, v in params.items() if k not in ("run", "method", "index")}
    lines = [
        f"# {name}", "",
        f"An extreme multi-label classifier: given a text, it ranks {manifest['labels']['count']:,} labels. It is "
        f"{what}; predictor kind `{pred.get('kind', '?')}`.{hybrid}", "",
        "## Use", "",
        "```bash",
        f"xmc info {name}                              # this package under packages/, or give its path",
        f"xmc predict {name} --input texts.txt -k 10   # one JSON line per text",
        f"xmc serve {name}                             # HTTP on 127.0.0.1:8000",
        "```", "",
        "```python",
        "import xmc",
        f"model = xmc.load('packages/{name}')",
        "scores, label_ids = model.topk(['a sentence to tag'], k=10)",
        "```", "",
        "## Data", "",
        f"- dataset: `{ds.get('source', '?')}`; {ds.get('train_instances', '?')} training instances",
        f"- training and validation files: {', '.join(ds.get('files', []))} (sha256 `{str(ds.get('sha256', ''))[:16]}…`)",
        f"- labels: `{manifest['labels'].get('file', 'labels.jsonl')}` (sha256 `{manifest['labels']['sha256'][:16]}…`)",
        "- choices were made on the validation split; the test split was read only to report the numbers below", "",
        "## Metrics", "",
        *_table(manifest.get("metrics") or {}), "",
        "Percentages. PSP: propensity-scored precision (Jain et al. 2016, A = 0.55, B = 1.5); unseen R@100: recall "
        "over test pairs whose label has no training instance.", "",
        "## Training", "",
        f"- run `{params.get('run', name)}`, method `{method}`; "
        + (training_budget(tr) if tr else "no training (a baseline or an off-the-shelf model)"),
        f"- code: xmc {manifest.get('code', {}).get('xmc', '?')}, git `{manifest.get('code', {}).get('git', '?')}`",
        "", "Settings (from params.yaml):", "", "```json", json.dumps(settings, indent=2, default=str)[:6000], "```", "",
        "## Limits", "",
        "- labels outside the package's label file cannot be predicted; a text in another language or domain than "
        "the training data gets no guarantee from the numbers above.",
    ]
    return "\n".join(lines) + "\n"


def encoder_card(run: str, method: str, config: dict[str, Any], summary: dict[str, Any], dataset: str) -> str:
    """The card of a trained encoder folder (``models/<run>/README.md``), in place of the generic one that
    sentence-transformers writes: what trained it, on what, with which settings. Test metrics come later, with
    the package (``packages/<run>/README.md``)."""
    last = summary.get("last_validation") or {}
    val = ", ".join(f"{k} {last[k]:.1f}" for k in ("P@1", "P@5", "PSP@5", "R@100") if isinstance(last.get(k), int | float))
    lines = [
        f"# {run}: a sentence encoder trained by xmc", "",
        f"Trained by the xmc run `{run}` ({METHOD_NOTES.get(method, method)}) on `{dataset}`; "
        f"{training_budget(summary)}." + (f" Validation at the end of training: {val}." if val else ""), "",
        "It loads as a sentence-transformers model (`SentenceTransformer(path)`: mean-pooled, L2-normalised "
        "embeddings). Ranking labels needs the label index and the labels too: use the model package "
        f"`packages/{run}/` (its card has the test metrics) with `xmc.load`, `xmc predict` or `xmc serve`.", "",
        "Settings (from params.yaml):", "", "```json", json.dumps(config, indent=2, default=str)[:6000], "```",
    ]
    return "\n".join(lines) + "\n"
