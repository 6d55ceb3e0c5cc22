"""Terminal rendering of a relay stream: each span coloured by the model that wrote it, then a stats line; the demo's
comparison table."""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..engine.core.spans import FinalEvent, ModelRole, RelayResult, StreamEvent, TextEvent
from ..prompts import answers_match, extract_answer

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


def seconds_per_token(result: RelayResult) -> float:
    return result.elapsed / max(result.usage.completion_tokens, 1)


def comparison_table(results: dict[str, RelayResult], reference: str) -> Table:
    """One row per run of the same question: its answer against the reference, tokens, the time to the answer, tokens
    per second, and the speed-up in time to the answer against the first run (what a user waits for; the sentence
    under the table adds per token)."""
    table = Table(show_edge=False)
    # Verified relay's rejected small tokens (dropped and rewritten by the large model), when any run verified.
    verified = any(r.usage.verified_tokens or r.usage.rejected_tokens for r in results.values())
    # "s" is the time to the answer, "speed-up" the first run's time over this one's: per answer, what a user waits for.
    columns = ("run", "answer", "tokens", "small", *(["rejected"] if verified else []), "s", "tok/s", "speed-up")
    for column in columns:
        table.add_column(column, justify="left" if column in ("run", "answer") else "right")
    first = next(iter(results.values()))
    for name, result in results.items():
        answer = extract_answer(result.text)
        verdict = "[green]correct[/green]" if answers_match(answer, reference) else "[red]wrong[/red]"
        usage, cost = result.usage, seconds_per_token(result)
        table.add_row(
            name, f"{answer} ({verdict})", str(usage.completion_tokens), f"{usage.small_share:.0%}",
            *([str(usage.rejected_tokens)] if verified else []),
            f"{result.elapsed:.1f}", f"{1 / cost if cost else 0:.2f}",
            f"[bold]{first.elapsed / result.elapsed if result.elapsed else 0:.2f}x[/bold]",
        )  # fmt: skip
    return table


def speedup_sentence(results: dict[str, RelayResult]) -> str:
    """The last run's time to the answer against the first's (the demo: relay against the large model alone), with
    the speed per token after it."""
    (first, baseline), (last, result) = next(iter(results.items())), list(results.items())[-1]
    answer = baseline.elapsed / result.elapsed if result.elapsed else 0.0
    rates = [1 / cost if (cost := seconds_per_token(r)) else 0.0 for r in (result, baseline)]
    ratio = rates[0] / rates[1] if rates[1] else 0.0
    return (
        f"{last} answered in {result.elapsed:.1f} s against {baseline.elapsed:.1f} s for {first}: {answer:.2f}x "
        f"faster to the answer on this question ({ratio:.2f}x per token: {rates[0]:.2f} vs {rates[1]:.2f} "
        "tokens/s); `relaygen bench` measures it over many."
    )
