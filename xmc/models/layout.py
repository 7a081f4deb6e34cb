"""How a trained model folder says what it is, without loading it (no torch): the description files of ASTRA and
UniDEC models, which :mod:`xmc.package.predictor` reads to pick the predictor of a folder trained outside the
harness (which writes ``model.json``)."""

from __future__ import annotations

from pathlib import Path

ASTRA_DESCRIPTION = "astra.json"     # {"dim", "n_labels"}
UNIDEC_DESCRIPTION = "unidec.json"   # {"dim", "dropout", "dropout_clf", "n_labels"}


def is_astra_model(path: str | Path) -> bool:
    return (Path(path) / ASTRA_DESCRIPTION).is_file()


def is_unidec_model(path: str | Path) -> bool:
    return (Path(path) / UNIDEC_DESCRIPTION).is_file()


__all__ = ["ASTRA_DESCRIPTION", "UNIDEC_DESCRIPTION", "is_astra_model", "is_unidec_model"]
