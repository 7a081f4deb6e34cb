"""MACLR (Xiong et al., NAACL 2022): extreme zero-shot XMC from raw text, then few-shot.

Zero-shot path (EZ-XMC), which never sees an (instance, label) pair:
  texts-only corpus (:mod:`xmc.maclr.corpus`) -> pseudo pairs (:mod:`xmc.maclr.pseudo`: TF-IDF top-k,
  inverse-cloze pairs) -> Stage I (:mod:`xmc.maclr.stage1`: ICT + multi-scale adaptive clustering +
  label regularisation) -> Stage II (:mod:`xmc.maclr.stage2`: self-training on dense + TF-IDF pseudo
  positives). Few-shot (:mod:`xmc.maclr.fewshot`) fine-tunes on the ground-truth pairs of a label subset.
"""

from xmc.maclr.clustering import ClusterSchedule, kmeans_assign
from xmc.maclr.corpus import ZeroShotCorpus, load_texts_only
from xmc.maclr.losses import label_regularisation_loss, supcon_loss
from xmc.maclr.pseudo import (PseudoPairs, agreed_pairs, dense_topk, ict_pairs_from_groups, ict_pairs_from_titles,
                              topk_to_csr, tfidf_topk, union_pairs)

__all__ = ["ClusterSchedule", "PseudoPairs", "ZeroShotCorpus", "agreed_pairs", "dense_topk", "ict_pairs_from_groups",
           "ict_pairs_from_titles", "kmeans_assign", "label_regularisation_loss", "load_texts_only", "supcon_loss",
           "tfidf_topk", "topk_to_csr", "union_pairs"]
