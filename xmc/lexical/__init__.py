"""Label names as evidence: names kept apart from descriptions, a lemmatising name matcher, the label-name
retriever (a zero-shot peer and a method's extra candidates) and the hybrid ranker that fuses a method's
scores with name matches (weights fit on the validation split)."""

from xmc.lexical.matcher import FEATURES, LabelNameMatcher, Match, word_forms
from xmc.lexical.names import LabelNames, normalise_name, parse_label_names

__all__ = ["FEATURES", "LabelNameMatcher", "LabelNames", "Match", "normalise_name", "parse_label_names", "word_forms"]
