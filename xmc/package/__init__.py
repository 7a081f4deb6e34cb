"""Model packages: build one from a trained run, load it anywhere, predict (``xmc.load(path).predict``).

Loading and predicting import the predictors and the trained-model classes (:mod:`xmc.models`), never the training
code (:mod:`xmc.trainer`, :mod:`xmc.methods`, :mod:`xmc.negatives`).
"""

from xmc.package.package import (FORMAT, FORMAT_VERSION, MAX_K, InputError, ModelPackage, Prediction, build_package,
                                 check_k, check_texts, finish_package, label_set_sha256, load, read_labels,
                                 read_manifest)

__all__ = ["FORMAT", "FORMAT_VERSION", "MAX_K", "InputError", "ModelPackage", "Prediction", "build_package",
           "check_k", "check_texts", "finish_package", "label_set_sha256", "load", "read_labels", "read_manifest"]
