"""Label names as evidence: names kept apart from descriptions, a lemmatising name matcher, the label-name
retriever (a zero-shot peer and a method's extra candidates) and the hybrid ranker that fuses a method's
scores with name matches (weights fit on the validation split)."""

from xmc.lexical.matcher import (FEATURES, ZERO_SHOT_NAME_WEIGHTS, LabelNameMatcher, Match, word_forms,
                                 zero_shot_name_scores, zero_shot_name_topk)
from xmc.lexical.names import LabelNames, normalise_name, parse_label_names

__all__ = ["FEATURES", "ZERO_SHOT_NAME_WEIGHTS", "LabelNameMatcher", "LabelNames", "Match", "normalise_name",
           "parse_label_names", "word_forms", "zero_shot_name_scores", "zero_shot_name_topk"]
