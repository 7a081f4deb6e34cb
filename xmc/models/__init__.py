"""Trained models as training writes them and packages load them: no training code here.

``dual_encoder`` (the dual encoder the trainer optimises, whose encoder a dense predictor serves), ``astra``
(encoder + classifier table), ``unidec`` (encoder + two heads + classifier table) and ``device`` (where a model
computes). The training classes of :mod:`xmc.methods` build on these and write their layouts.
"""
