"""Text encoders behind one interface (:class:`TextEncoder`): the hashed bag-of-words table and transformer
(sentence-transformers / Hugging Face) folders; :mod:`xmc.encoders.cache` reuses large encodings."""

from __future__ import annotations

from xmc.encoders.base import TextEncoder
from xmc.encoders.bow import HashedBagOfWordsEncoder
from xmc.encoders.build import build_encoder, load_encoder
from xmc.encoders.transformer import TransformerEncoder, default_model_dir

__all__ = ["HashedBagOfWordsEncoder", "TextEncoder", "TransformerEncoder", "build_encoder", "default_model_dir", "load_encoder"]
