"""An instrumentation handler that records LlamaIndex events (used through the ``collector`` fixture)."""

from __future__ import annotations

from typing import Any, ClassVar

from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent


class Collector(BaseEventHandler):
    """Keeps every instrumentation event it sees."""

    events: ClassVar[list[BaseEvent]] = []

    @classmethod
    def class_name(cls) -> str:
        return "Collector"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        self.events.append(event)

    def of(self, kind: type[BaseEvent]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]
