"""What a ``dim_param`` text in a model means before any inference: a name, or no name at all.

Exporters write texts that name no dim (paddle2onnx ``?``; ``-1`` and ``None`` from shape lists
printed as text): two of them are not the same dim. The feeds (onnx_quant/feeds.py) and the
symbolic dims (inference/dims.py) read them alike.
"""

from __future__ import annotations

#: dim_param texts that name no dim
ANONYMOUS_TEXTS = frozenset({"", "?", "-1", "None"})


def is_anonymous(text: str) -> bool:
    """Whether a dim_param text names no dim (see :data:`ANONYMOUS_TEXTS`)."""
    return text.strip() in ANONYMOUS_TEXTS
