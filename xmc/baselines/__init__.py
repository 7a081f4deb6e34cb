"""Non-neural baselines: label prior, TF-IDF zero-shot, TF-IDF kNN label voting."""

from xmc.baselines.tfidf import (
    LabelPrior,
    TfidfFeatures,
    fit_tfidf,
    knn_label_voting,
    label_prior_predict,
    tfidf_zero_shot,
)

__all__ = ["LabelPrior", "TfidfFeatures", "fit_tfidf", "knn_label_voting", "label_prior_predict", "tfidf_zero_shot"]
