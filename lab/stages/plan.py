"""The lab's training plans: lab/results/<data.name>/plans/<run>.json for every lab run (xmc.methods.plan), as the product's plan stage.

A lab run trains, predicts and is evaluated in one stage (lab/stages/run.py), so its plan covers the code of all
three and the data its prediction and evaluation read (the splits it predicts, the training labels' counts). A run of
``from_product`` depends on its product model's folder through its stage (lab/dvc.yaml), not through its plan.
"""

from __future__ import annotations

import json

from lab.config import load_lab
from lab.results import lab_root
from xmc.config import run_entry_point
from xmc.data.dataset import FILTER_FILES, SPLIT_FILES
from xmc.io import atomic_dir
from xmc.methods.plan import _sha256_tree, code_closure, run_plan
from xmc.workspace import product_workspace

STAGE = "lab.stages.run"


def main() -> None:
    cfg = load_lab()
    product, entries, specs = cfg["product"], cfg["entries"], cfg["specs"]
    ws = product_workspace(product)
    code = {p.as_posix(): _sha256_tree(p) for p in code_closure(STAGE, "xmc.package.build")}
    with atomic_dir(lab_root() / "plans") as tmp:
        for name, entry in entries.items():
            if entry["from_model"] is not None:   # its stage depends on the product model's folder itself
                plan = {"run": name, "from_model": entry["from_model"]}
            else:
                plan = run_plan(product, specs[name], ws, stage=STAGE)
            read = [ws.processed / f for part in ("lbl", "trn", *entry["splits"].split()) for f in SPLIT_FILES[part]]
            read += [ws.processed / FILTER_FILES[p] for p in ("val", *entry["splits"].split()) if p in FILTER_FILES]
            plan.update({"lab": entry, "predict_code": code, "settings_predict": {
                k: product[k] for k in ("index", "evaluate")},
                "predict_inputs": {p.as_posix(): _sha256_tree(p) if p.exists() else None for p in read}})
            (tmp / f"{name}.json").write_text(json.dumps(plan, indent=1, sort_keys=True, default=str) + "\n")


if __name__ == "__main__":
    run_entry_point(main)
