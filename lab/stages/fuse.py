"""A lab hybrid (lab/params.yaml ``hybrids``): a lab run's candidates + the label-name matches under the product's
fusion (params.yaml ``hybrid``) -> lab/results/<data.name>/runs/<hybrid>/ (predictions and metrics; no package: the base's is not kept).

Usage: ``python -m lab.stages.fuse <hybrid>``; ``python -m lab.stages.fuse --ensemble``: the product runs of
lab/params.yaml ``ensemble`` under one fusion -> lab/results/<data.name>/runs/<ensemble name>/.
"""

from __future__ import annotations

import sys

from lab.config import load_lab
from lab.results import lab_workspace, product
from xmc.config import run_entry_point
from xmc.errors import ConfigError
from xmc.machine import set_threads
from xmc.package.fuse import fuse


def main() -> None:
    if len(sys.argv) != 2:
        raise ConfigError("usage: python -m lab.stages.fuse <hybrid>")
    name = sys.argv[1]
    cfg = load_lab()
    if name == "--ensemble":
        ens = cfg["lab"]["ensemble"]
        if not ens["members"]:
            raise ConfigError("lab/params.yaml: ensemble.members is empty (no ensemble to fuse)")
        set_threads()
        fuse(cfg["product"], ens["name"], list(ens["members"]), lab_workspace(ens["name"]), base_ws=product(),
             with_package=False)
        return
    hybrids = cfg["lab"]["hybrids"]
    if name not in hybrids:
        raise ConfigError(f"lab/params.yaml: {name!r} is not under hybrids (have: {', '.join(hybrids)})")
    h = hybrids[name]
    base = h["base"]
    if base not in cfg["entries"]:
        raise ConfigError(f"lab/params.yaml: hybrids.{name}.base: {base!r} is not a lab run")
    splits = tuple(cfg["entries"][base]["splits"].split())
    set_threads()
    fuse(cfg["product"], name, [base], lab_workspace(name), valtuned=h["fusion"] == "valtuned", splits=splits,
         base_ws=lab_workspace(base), with_package=False)


if __name__ == "__main__":
    run_entry_point(main)
