"""xmc: extreme multi-label classification with dual encoders.

One package per concern: ``xmc.data`` (formats and the canonical processed form),
``xmc.validation`` (great-expectations checks and report), ``xmc.baselines``
(label prior, TF-IDF zero-shot and kNN), ``xmc.metrics`` (P@k, nDCG@k, PSP@k, recall),
``xmc.report`` (comparison table).
"""

__version__ = "0.1.0"
