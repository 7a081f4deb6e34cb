"""xmc: extreme multi-label classification with dual encoders.

One package per concern: ``xmc.data`` (formats and the canonical processed form),
``xmc.validation`` (great-expectations checks and report), ``xmc.baselines``
(label prior, TF-IDF zero-shot and kNN), ``xmc.metrics`` (P@k, nDCG@k, PSP@k, recall),
``xmc.report`` (comparison table), ``xmc.package`` (model packages: ``xmc.load(path).predict(texts, k)``),
``xmc.api`` (``xmc.train(data_dir, method=...)``: a dataset folder to a model package), ``xmc.cli`` (the ``xmc``
command) and ``xmc.serve`` (the HTTP service).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def train(data_dir: str, method: str = "astra", out: str | None = None, **overrides: Any) -> Any:
    """Train ``method`` on the dataset folder ``data_dir`` and write its model package (default
    ``models/<method>``): see :func:`xmc.api.train`. Returns the loaded :class:`xmc.package.ModelPackage`."""
    from xmc.api import train as _train   # imported on call: `import xmc` stays free of torch and the training code

    return _train(data_dir, method=method, out=out, **overrides)


def load(model: str, **kwargs: Any) -> Any:
    """A model package by path or registry name (``astra``, ``astra#prod``, ``astra@v1.2.0``): see
    :func:`xmc.package.registry.resolve`. Returns a :class:`xmc.package.ModelPackage`; imported lazily so that
    ``import xmc`` stays free of torch and faiss."""
    from xmc.package.registry import load_model   # imported on call: `import xmc` stays free of torch and faiss

    return load_model(model, **kwargs)
