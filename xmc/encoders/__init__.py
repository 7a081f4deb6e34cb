"""Text encoders behind one interface (:class:`xmc.encoders.base.TextEncoder`): the hashed bag-of-words table
(:mod:`~xmc.encoders.bow`) and transformer folders (:mod:`~xmc.encoders.transformer`, sentence-transformers /
Hugging Face), built or loaded by :mod:`~xmc.encoders.build`; :mod:`~xmc.encoders.cache` reuses large encodings.

Import from the submodules: this package imports none of them, so a process that only configures the encoding
cache (every train and package stage, the baselines' too) does not import torch.
"""
