"""Terminal rendering of a relay stream: each span coloured by the model that wrote it, then a stats line."""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console
from rich.text import Text

from .engine.spans import FinalEvent, ModelRole, RelayResult, StreamEvent, TextEvent

MODEL_STYLES: dict[ModelRole, str] = {"large": "bold cyan", "small": "bold magenta"}


def legend(large_name: str, small_name: str) -> Text:
    return Text.assemble(
        ("■ large ", MODEL_STYLES["large"]), (f"({large_name})  ", "dim"),
        ("■ small ", MODEL_STYLES["small"]), (f"({small_name})", "dim"),
    )  # fmt: skip


def stats_line(result: RelayResult) -> Text:
    usage = result.usage
    rate = usage.completion_tokens / result.elapsed if result.elapsed > 0 else 0.0
    line = Text.assemble(
        ("large ", MODEL_STYLES["large"]), f"{usage.large_tokens} tok · ",
        ("small ", MODEL_STYLES["small"]), f"{usage.small_tokens} tok ({usage.small_share:.0%}) · ",
        f"switches {usage.switches} · {result.elapsed:.1f} s · {rate:.1f} tok/s · finish {result.finish_reason}",
    )  # fmt: skip
    if usage.draft_tokens:
        mean_draft = usage.draft_tokens / usage.speculative_rounds
        line.append(f" · drafts accepted {usage.acceptance_rate:.0%} (mean k {mean_draft:.1f})")
    return line


def print_stream(events: Iterable[StreamEvent], console: Console) -> RelayResult:
    """Prints text as it arrives, coloured by model; returns the final result."""
    for event in events:
        if isinstance(event, TextEvent):
            console.print(Text(event.text, style=MODEL_STYLES[event.model]), end="", soft_wrap=True)
        elif isinstance(event, FinalEvent):
            console.print()
            return event.result
    raise RuntimeError("the stream ended without a final result")
