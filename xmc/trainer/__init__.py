"""One trainer for every method: losses, objectives and samplers plug in (:mod:`~xmc.trainer.trainer`,
:mod:`~xmc.trainer.objective`, :mod:`~xmc.trainer.evaluator`).

Import from the submodules: this package imports none of them, so the torch-free helpers here (the training log,
memory release) stay free of torch for the processes that train no network.
"""
