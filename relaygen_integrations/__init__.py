"""relaygen-integrations: RelayGen intra-generation model switching for LangChain and LlamaIndex."""

from .engine import (
    CueSet,
    FinalEvent,
    GenerationError,
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
    "PolicyConfig",
    "RelayEngine",
    "RelayResult",
    "Span",
    "SwitchEvent",
    "TextEvent",
    "Usage",
    "__version__",
]
