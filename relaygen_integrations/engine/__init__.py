"""Framework-free relay engine (no LangChain / LlamaIndex imports below this package).

Names are imported on first access, so light modules (``core.spans``, ``core.settings``, ``core.prompt``) load
without torch. Layout: ``core/`` (backend-independent), ``local/`` and ``remote/`` (one folder per backend), and
``engine.py`` (the front, over any backend).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core.backend import Backend, BackendCapabilityError, GenerationSession
    from .core.cues import PRESETS, CueConfigError, CueSet, resolve_cues
    from .core.guard import EngineBusyError
    from .core.pairs import ModelLoadError, TokenizerMismatchError
    from .core.policy import Decision, PolicyConfig, RelayPolicy
    from .core.prompt import MessageError, ToolSchemaError
    from .core.settings import (
        GenerationError,
        GenerationPlan,
        GenerationSettings,
        PromptError,
        SamplingParams,
        SettingsError,
        merge_settings,
    )
    from .core.spans import FinalEvent, RelayResult, Span, StreamEvent, SwitchEvent, TextEvent, Usage
    from .engine import RelayEngine
    from .local.backend import LocalBackend

# Where each public name lives.
_HOME = {
    "Backend": "core.backend",
    "BackendCapabilityError": "core.backend",
    "GenerationSession": "core.backend",
    "PRESETS": "core.cues",
    "CueConfigError": "core.cues",
    "CueSet": "core.cues",
    "resolve_cues": "core.cues",
    "RelayEngine": "engine",
    "EngineBusyError": "core.guard",
    "LocalBackend": "local.backend",
    "ModelLoadError": "core.pairs",
    "TokenizerMismatchError": "core.pairs",
    "Decision": "core.policy",
    "PolicyConfig": "core.policy",
    "RelayPolicy": "core.policy",
    "MessageError": "core.prompt",
    "ToolSchemaError": "core.prompt",
    "SamplingParams": "core.settings",
    "GenerationError": "core.settings",
    "GenerationPlan": "core.settings",
    "GenerationSettings": "core.settings",
    "PromptError": "core.settings",
    "SettingsError": "core.settings",
    "merge_settings": "core.settings",
    "FinalEvent": "core.spans",
    "RelayResult": "core.spans",
    "Span": "core.spans",
    "StreamEvent": "core.spans",
    "SwitchEvent": "core.spans",
    "TextEvent": "core.spans",
    "Usage": "core.spans",
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
