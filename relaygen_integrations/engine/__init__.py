"""Framework-free relay engine (no LangChain / LlamaIndex imports below this package)."""

from .cues import PRESETS, CueConfigError, CueSet, resolve_cues
from .engine import GenerationError, GenerationPlan, RelayEngine
from .models import ModelLoadError, TokenizerMismatchError
from .policy import Decision, PolicyConfig, RelayPolicy
from .sampling import SamplingParams
from .spans import FinalEvent, RelayResult, Span, StreamEvent, SwitchEvent, TextEvent, Usage

__all__ = [
    "PRESETS",
    "CueConfigError",
    "CueSet",
    "Decision",
    "FinalEvent",
    "GenerationError",
    "GenerationPlan",
    "ModelLoadError",
    "PolicyConfig",
    "RelayEngine",
    "RelayPolicy",
    "RelayResult",
    "SamplingParams",
    "Span",
    "StreamEvent",
    "SwitchEvent",
    "TextEvent",
    "TokenizerMismatchError",
    "Usage",
    "resolve_cues",
]
