"""TF-IDF: one vectoriser fit on training and label texts -> data/tfidf (xmc.features.build_tfidf).

The test split is not read here: the predictors transform it with the saved vectoriser.
"""

from __future__ import annotations

from xmc.config import load_params, run_entry_point
from xmc.features.tfidf import build_tfidf
from xmc.workspace import product_workspace


def main() -> None:
    params = load_params()
    build_tfidf(params, product_workspace(params))


if __name__ == "__main__":
    run_entry_point(main)
