"""Fuse one run's predictions with label-name matches -> predictions/<run>_hybrid/ and indexes/<run>_hybrid/.

Usage: ``python -m stages.fuse <run>`` for each run in params ``hybrid.runs``. A prediction stage: candidates are
the top-k of the run's base (``hybrid.runs``: the run itself, or the run its hybrid chose on validation) ∪ the
labels whose names occur in the text; the fusion weights are fit on the validation split (validation predictions
cross-fitted by document) and applied to the test texts (xmc.lexical.fuse).

``python -m stages.fuse <run> --zero-shot`` for each run in ``hybrid.zero_shot_runs`` -> ``<run>_zs_hybrid``:
the same candidates under a fusion that reads no training data (the name matches' zero-shot score plus a weighted
method score; two weights chosen on validation from the ``hybrid.zero_shot`` grids).

``python -m stages.fuse --ensemble`` -> ``hybrid.ensemble.name`` (``ensemble_hybrid``): the member runs' top-k lists
∪ the name matches under one logistic fusion of every member's score and the name evidence, fit on validation.
"""

from __future__ import annotations

import sys

from xmc.config import load_params, run_entry_point
from xmc.errors import ConfigError


def main() -> None:
    args = sys.argv[1:]
    zero_shot = "--zero-shot" in args
    params = load_params()
    if args == ["--ensemble"]:
        if not params["hybrid"]["ensemble"]["members"]:
            raise ConfigError("params.yaml: hybrid.ensemble.members is empty (no ensemble to fuse)")
        from xmc.lexical.fuse import fuse_ensemble
        from xmc.methods.base import set_threads

        set_threads()
        fuse_ensemble(params)
        return
    args = [a for a in args if a != "--zero-shot"]
    if len(args) != 1:
        raise ConfigError("usage: python -m stages.fuse <run> [--zero-shot] | python -m stages.fuse --ensemble")
    name = args[0]
    key = "zero_shot_runs" if zero_shot else "runs"
    if name not in params["hybrid"][key]:
        raise ConfigError(f"params.yaml: {name!r} is not in hybrid.{key} (have: {', '.join(params['hybrid'][key])})")
    from xmc.lexical.fuse import fuse_run, hybrid_base
    from xmc.methods.base import set_threads

    set_threads()
    fuse_run(params, name, zero_shot=zero_shot, base=None if zero_shot else hybrid_base(params, name))


if __name__ == "__main__":
    run_entry_point(main)
