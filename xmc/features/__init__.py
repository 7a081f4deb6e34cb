"""The data layer of a pipeline: ingest, validation and the features the methods read.

* :mod:`xmc.features.ingest`: any supported dataset folder -> ``data/processed`` (the validation split carved out of
  training where the dataset ships none);
* :mod:`xmc.features.validation`: great-expectations checks -> ``reports/validation/`` and the gate training waits on;
* :mod:`xmc.features.tfidf`: one TF-IDF vectoriser fit on training + label texts -> ``data/tfidf``;
* :mod:`xmc.features.graph`: RAMEN's anchor sets, augmented by random walk with restart -> ``data/graph``;
* :mod:`xmc.features.maclr_pairs`: MACLR's pseudo pairs from raw text (no labelled pair) -> ``data/maclr_pairs``.

The DVC stages of the same names and ``xmc train`` call these; each writes atomically into its
:class:`~xmc.workspace.Workspace` folder. One module per feature, so a stage imports what it builds only.
"""

# the features each method's training reads beyond the processed data (``xmc train`` builds only these)
FEATURES_OF: dict[str, tuple[str, ...]] = {"maclr": ("maclr_pairs",), "ramen": ("graph",), "tfidf_zeroshot": ("tfidf",),
                                           "tfidf_knn": ("tfidf",)}

__all__ = ["FEATURES_OF"]
