"""relaygen-integrations: RelayGen intra-generation model switching for LangChain and LlamaIndex.

The engine (torch + transformers) is imported on first attribute access, so light entry points such as
``relaygen models path`` start in milliseconds.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import (
        CueSet,
        FinalEvent,
        GenerationError,
        GenerationSettings,
        PolicyConfig,
        RelayEngine,
        RelayResult,
        Span,
        SwitchEvent,
        TextEvent,
        Usage,
    )

__version__ = "0.1.0"

__all__ = [
    "CueSet",
    "FinalEvent",
    "GenerationError",
    "GenerationSettings",
    "PolicyConfig",
    "RelayEngine",
    "RelayResult",
    "Span",
    "SwitchEvent",
    "TextEvent",
    "Usage",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(".engine", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
