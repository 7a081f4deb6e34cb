"""Methods as compositions of shared parts (encoder, sampler, loss, trainer, index).

Every method implements :class:`~xmc.methods.base.Method` once; :func:`get_method` returns it by the name
a run's ``method`` names (:mod:`xmc.config.runs`). Classes are imported when asked for: a stage imports the one
method it trains, not all of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from xmc.errors import ConfigError

if TYPE_CHECKING:
    from xmc.methods.base import Method

# method name -> "module:class"
METHODS: dict[str, str] = {
    "dexml": "xmc.methods.dual_encoder:DEXMLMethod",
    "ramen": "xmc.methods.ramen:RAMENMethod",
    "unidec": "xmc.methods.unidec:UniDECMethod",
    "astra": "xmc.methods.astra:ASTRAMethod",
    "maclr": "xmc.methods.maclr:MACLRMethod",
    "maclr_fewshot": "xmc.methods.maclr:MACLRFewShotMethod",
    "st_mnrl": "xmc.methods.peers:STMNRLMethod",
    "pretrained": "xmc.methods.peers:PretrainedMethod",
    "label_prior": "xmc.methods.baselines:LabelPriorMethod",
    "tfidf_zeroshot": "xmc.methods.baselines:TfidfZeroShotMethod",
    "tfidf_knn": "xmc.methods.baselines:TfidfKNNMethod",
    "name_match": "xmc.methods.baselines:NameMatchMethod",
}


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r} (have: {', '.join(METHODS)})")
    module, cls = METHODS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


__all__ = ["METHODS", "get_method"]
