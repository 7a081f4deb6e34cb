"""Model packages: build one from a trained run, load it anywhere, predict (``xmc.load(path).predict``)."""

from xmc.package.package import (FORMAT, FORMAT_VERSION, MAX_K, InputError, ModelPackage, Prediction, build_package,
                                 check_k, check_texts, label_set_sha256, load, package_from_predictor, read_labels,
                                 read_manifest)

__all__ = ["FORMAT", "FORMAT_VERSION", "MAX_K", "InputError", "ModelPackage", "Prediction", "build_package",
           "check_k", "check_texts", "label_set_sha256", "load", "package_from_predictor", "read_labels",
           "read_manifest"]
