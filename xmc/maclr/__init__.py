"""MACLR (Xiong et al., NAACL 2022): extreme zero-shot XMC from raw text, then few-shot.

Zero-shot path (EZ-XMC), which never sees an (instance, label) pair:
  texts-only corpus (:mod:`xmc.maclr.corpus`) -> pseudo pairs (:mod:`xmc.maclr.pseudo`: TF-IDF top-k,
  inverse-cloze pairs) -> Stage I (ICT + multi-scale adaptive clustering (:mod:`xmc.maclr.clustering`) + label
  regularisation (:mod:`xmc.maclr.losses`)) -> Stage II (self-training on dense + TF-IDF pseudo positives).
  Both stages and the few-shot fine-tuning on the ground-truth pairs of a label subset: :mod:`xmc.maclr.train`.

The package re-exports nothing: each module is imported by its name, so the pseudo-pair stage (corpus, pseudo)
does not import the training losses and torch.
"""
