"""Framework-free relay engine (no LangChain / LlamaIndex imports below this package).

Names are imported on first access, so light modules (``spans``, ``settings``, ``prompt``) load without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import Backend, BackendCapabilityError, GenerationSession
    from .cues import PRESETS, CueConfigError, CueSet, resolve_cues
    from .engine import RelayEngine
    from .guard import EngineBusyError
    from .local import LocalBackend
    from .models import ModelLoadError, TokenizerMismatchError
    from .policy import Decision, PolicyConfig, RelayPolicy
    from .prompt import MessageError, ToolSchemaError
    from .sampling import SamplingParams
    from .settings import (
        GenerationError,
        GenerationPlan,
        GenerationSettings,
        PromptError,
        SettingsError,
        merge_settings,
    )
    from .spans import FinalEvent, RelayResult, Span, StreamEvent, SwitchEvent, TextEvent, Usage

# Where each public name lives.
_HOME = {
    "Backend": "backend",
    "BackendCapabilityError": "backend",
    "GenerationSession": "backend",
    "PRESETS": "cues",
    "CueConfigError": "cues",
    "CueSet": "cues",
    "resolve_cues": "cues",
    "RelayEngine": "engine",
    "EngineBusyError": "guard",
    "LocalBackend": "local",
    "ModelLoadError": "models",
    "TokenizerMismatchError": "models",
    "Decision": "policy",
    "PolicyConfig": "policy",
    "RelayPolicy": "policy",
    "MessageError": "prompt",
    "ToolSchemaError": "prompt",
    "SamplingParams": "sampling",
    "GenerationError": "settings",
    "GenerationPlan": "settings",
    "GenerationSettings": "settings",
    "PromptError": "settings",
    "SettingsError": "settings",
    "merge_settings": "settings",
    "FinalEvent": "spans",
    "RelayResult": "spans",
    "Span": "spans",
    "StreamEvent": "spans",
    "SwitchEvent": "spans",
    "TextEvent": "spans",
    "Usage": "spans",
}

__all__ = [
    "PRESETS",
    "Backend",
    "BackendCapabilityError",
    "CueConfigError",
    "CueSet",
    "Decision",
    "EngineBusyError",
    "FinalEvent",
    "GenerationError",
    "GenerationPlan",
    "GenerationSession",
    "GenerationSettings",
    "LocalBackend",
    "MessageError",
    "ModelLoadError",
    "PolicyConfig",
    "PromptError",
    "RelayEngine",
    "RelayPolicy",
    "RelayResult",
    "SamplingParams",
    "SettingsError",
    "Span",
    "StreamEvent",
    "SwitchEvent",
    "TextEvent",
    "TokenizerMismatchError",
    "ToolSchemaError",
    "Usage",
    "merge_settings",
    "resolve_cues",
]


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
