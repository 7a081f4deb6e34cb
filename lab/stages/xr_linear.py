"""A variant of the product's linear peer (lab/params.yaml ``xr_linear``: params.yaml ``xr_linear`` with these
overrides), trained and predicted in .venv-pecos on the product's TF-IDF features -> lab/results/<data.name>/runs/<variant>/
(``python -m lab.stages.evaluate`` scores it in the main environment; the model is removed after predicting).

Usage: ``.venv-pecos/bin/python -m lab.stages.xr_linear <variant> [val] [tst]``.
"""

from __future__ import annotations

import shutil
import sys

from lab.config import load_lab
from lab.results import lab_workspace
from stages.xr_linear import predict, train
from xmc.config import run_entry_point
from xmc.config.schema import deep_merge
from xmc.errors import ConfigError
from xmc.predictions import run_and_splits


def main() -> None:
    name, splits = run_and_splits(sys.argv[1:], "python -m lab.stages.xr_linear <variant> [val] [tst]")
    cfg = load_lab()
    variants = cfg["lab"]["xr_linear"]
    if name not in variants:
        raise ConfigError(f"lab/params.yaml: {name!r} is not under xr_linear (have: {', '.join(variants)})")
    settings = deep_merge(next(iter(cfg["product"]["xr_linear"].values()), {}), variants[name] or {})
    ws = lab_workspace(name)
    train(cfg["product"], settings, name, ws)
    predict(cfg["product"], settings, name, splits, ws)
    shutil.rmtree(ws.root / "models", ignore_errors=True)


if __name__ == "__main__":
    run_entry_point(main)
