"""Benchmark outputs: ``results.json`` (every run), ``report.md`` (tables + machine), ``speed_accuracy.png`` and
``traces.html`` (relay answers coloured by model, trigger and tokens on hover)."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from ..prompts import MATH_SYSTEM_PROMPT
from .predicted import render_predicted
from .summary import is_relay_mode, paired_accuracy_gain, pareto_front


def write_outputs(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    (out / "report.md").write_text(render_markdown(report))
    (out / "traces.html").write_text(render_traces(report))
    plot_speed_accuracy(report, out / "speed_accuracy.png")


def _cpu_flags_text(machine: dict[str, Any]) -> str:
    """CPU instruction sets decide what a multi-position pass costs, so a report names them (older runs lack them)."""
    if "cpu_flags" not in machine:
        return ""
    flags = " ".join(machine["cpu_flags"]) or "none of the tracked"
    return f" (CPU flags: {flags}; torch CPU capability {machine['torch_cpu_capability']})"


def render_verification(summary: dict[str, dict[str, Any]]) -> list[str]:
    """What verification costs, per problem, next to plain relay when it ran: the extra output-projection rows are
    the checked tokens; the wasted small-model work is the rejected tokens; the time is in the where-the-time-goes
    table."""
    verified = {mode: s for mode, s in summary.items() if "checked_per_problem" in s}
    if not verified:
        return []
    lines = [
        "",
        "Verification per problem: small segments, tokens the large model checked (each an extra output-projection"
        " row in a catch-up pass it runs anyway), rejections, small tokens thrown away and kept.",
        "",
        "| mode | small segments | checked tokens | rejections | rejected tokens | kept small tokens |",
        "|---|---|---|---|---|---|",
    ]
    if "small_segments_per_problem" in summary.get("relay", {}):
        relay = summary["relay"]
        kept = relay["small_share"] * relay["mean_tokens"]
        lines.append(f"| relay (unverified) | {relay['small_segments_per_problem']:.1f} | – | – | – | {kept:.0f} |")
    for mode, s in verified.items():
        cells = [mode, f"{s['segments_per_problem']:.1f}", f"{s['checked_per_problem']:.0f}",
                 f"{s['rejections_per_problem']:.1f}", f"{s['rejected_per_problem']:.0f}",
                 f"{s['kept_small_per_problem']:.0f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _backend_text(machine: dict[str, Any]) -> str:
    if machine.get("backend") == "remote":  # the models ran on the servers, with their own settings
        load = f", {machine['concurrency']} requests at once" if machine.get("concurrency", 1) > 1 else ""
        return f"; servers {' (large) and '.join(machine['endpoints'])} (small){load}"
    return (
        f", {machine['threads']} torch threads, torch {machine['torch']}, {machine['dtype']} on {machine['device']}"
        f"{', ' + machine['kv_cache'] + ' KV cache' if 'kv_cache' in machine else ''}"
    )


def machine_text(machine: dict[str, Any]) -> str:
    """What measured a run: CPU, cores, threads, torch, dtype, device, KV cache (or the servers), CPU flags."""
    return f"{machine['cpu']}, {machine['cores']} cores{_backend_text(machine)}{_cpu_flags_text(machine)}"


def render_markdown(report: dict[str, Any]) -> str:
    config, machine, summary = report["config"], report["machine"], report["summary"]
    remote = machine.get("backend") == "remote"
    pair = f"two servers (tokenizer {config['large']})" if remote else f"{config['large']} + {config['small']}"
    # A resumed run may hold modes added or dropped on the way: say so rather than print one mode's count as the run's.
    counts = sorted({s["n"] for s in summary.values()})
    problems = f"{counts[-1]} problems" + ("" if len(counts) == 1 else "; modes ran on fewer where the tables say")
    lines = [
        f"# Benchmark: {pair} on GSM8K ({problems})",
        "",
        f"Machine: {machine_text(machine)}. "
        f"{'Greedy' if not config['temperature'] else 'T=' + str(config['temperature'])}, "
        f"max {config['max_new_tokens']}"
        f' new tokens, cues `{config["cues"]}`. System prompt: "{MATH_SYSTEM_PROMPT}"',
        "",
        "Speed-up per answer (seconds per answer against `large` on the same problems: total, and the median over"
        " problems) leads, since it is what a user waits for; per token follows. Rows run from the fastest answer.",
        "",
        "| mode | accuracy | speed-up per answer | median per answer | mean s | median s | mean tokens | tok/s"
        " | speed-up per token | median per token | cap hits | f | switches | ideal | efficiency | drafts accepted"
        " | rejected |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, s in summary.items():
        cells = [
            mode, f"{s['accuracy']:.0%}", _times(s, "answer_speedup_vs_large", bold=True),
            _times(s, "median_answer_speedup_vs_large"), f"{s['mean_s']:.1f}", f"{s['median_s']:.1f}",
            f"{s['mean_tokens']:.0f}", f"{s['tok_per_s']:.2f}", _times(s, "speedup_vs_large"),
            _times(s, "median_speedup_vs_large"), str(s["cap_hits"]),
        ]  # fmt: skip
        cells += [f"{s['small_share']:.2f}", f"{s['switches_per_problem']:.1f}"] if "small_share" in s else ["", ""]
        cells += [f"{s['ideal_speedup']:.2f}×", f"{s['efficiency']:.2f}"] if "ideal_speedup" in s else ["", ""]
        if "acceptance_rate" in s:
            cells.append(f"{s['acceptance_rate']:.0%} (mean k {s['mean_draft_length']:.1f})")
        else:
            cells.append("")
        cells.append(f"{s['rejected_share']:.0%}" if "rejected_share" in s else "–")
        lines.append("| " + " | ".join(cells) + " |")
    if any("rejected_share" in s for s in summary.values()):
        lines += [
            "",
            "rejected (verified relay): the small model's tokens that verification dropped (each rejected token and"
            " the rest of its segment, rewritten by the large model), as a share of all it wrote (dropped + kept).",
        ]
    lines += render_verification(summary)
    if "relay" in summary and "r" in summary["relay"]:
        lines += ["", f"r (small/large cost per token, measured in this run) = {summary['relay']['r']:.3f}; "
                  "ideal speed-up = 1/((1−f)+f·r); speed-ups compare seconds per token."]  # fmt: skip
    split = {mode: s for mode, s in summary.items() if "large_forward_ms_per_token" in s}
    if split:
        lines += [
            "",
            "Where the time goes, per generated token (ms): inside the large model's forward passes, inside the small"
            " model's, and the rest (sampling, detokenizing, policy, Python). Speculative modes: cost of one verify"
            " pass, of one small-model token (drafted, or written in its own segment), and large-model tokens gained"
            " per verify pass.",
            "",
            "| mode | large fwd | small fwd | other | total | ms per verify pass | ms per small-model token"
            " | large tokens per verify pass |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for mode, s in split.items():
            total = s["large_forward_ms_per_token"] + s["small_forward_ms_per_token"] + s["other_ms_per_token"]
            cells = [mode, f"{s['large_forward_ms_per_token']:.0f}", f"{s['small_forward_ms_per_token']:.0f}",
                     f"{s['other_ms_per_token']:.0f}", f"{total:.0f}"]  # fmt: skip
            if "ms_per_verify_pass" in s:
                cells += [f"{s['ms_per_verify_pass']:.0f}", f"{s['ms_per_small_token']:.0f}",
                          f"{s['tokens_per_verify_pass']:.2f}"]  # fmt: skip
            else:
                cells += ["", "", ""]
            lines.append("| " + " | ".join(cells) + " |")
    lines += render_time_split(summary)
    lines += render_predicted(report)
    lines += render_paired(summary)
    lines += ["", "![speed vs accuracy](speed_accuracy.png)", ""]
    return "\n".join(lines)


def _times(summary: dict[str, Any], key: str, bold: bool = False) -> str:
    """A speed-up cell; "–" where the run has no ``large`` to compare with."""
    if key not in summary:
        return "–"
    return f"**{summary[key]:.2f}×**" if bold else f"{summary[key]:.2f}×"


# (column title, time-split key) of the per-answer table; keys from ``bench_summary.time_split``.
_SPLIT_COLUMNS = (
    ("large decode", "large.decode"), ("large prefill", "large.prefill"), ("large catch-up", "large.catchup"),
    ("verify drafts", "large.verify_drafts"), ("verify copied drafts", "large.verify_lookup"),
    ("verify sentences", "large.verify_sentences"),
    ("small sentences", "small.decode"), ("of which thrown away", "small.decode.thrown_away"),
    ("drafting", "small.draft"), ("of which rejected", "small.draft.rejected"),
    ("small prefill + catch-up", ("small.prefill", "small.catchup")), ("lookup search", "lookup.search"),
    ("other", "other"),
)  # fmt: skip


def render_time_split(summary: dict[str, Any]) -> list[str]:
    """Where each answer's time goes (mean seconds per answer), by model and by what each forward pass was for, so
    the next lever is visible: the term that dominates a mode is the one to cut."""
    rows = {mode: s["time_split_s"] for mode, s in summary.items() if "time_split_s" in s}
    if not rows:
        return []
    lines = [
        "",
        'Where the time goes, per answer (mean seconds): forward passes by model and purpose; "thrown away" is the'
        ' small model\'s sentence time on tokens verification rejected, "rejected" its drafting time on drafts the'
        " large model refused (both at the mean cost per token); other is sampling, detokenizing, policy, Python.",
        "",
        "| mode | total | " + " | ".join(title for title, _ in _SPLIT_COLUMNS) + " |",
        "|---|---|" + "---|" * len(_SPLIT_COLUMNS),
    ]
    for mode, split in rows.items():
        total = summary[mode]["mean_s"]
        cells = [mode, f"{total:.1f}"]
        for _, key in _SPLIT_COLUMNS:
            value = sum(split.get(k, 0.0) for k in key) if isinstance(key, tuple) else split.get(key, 0.0)
            cells.append(f"{value:.1f}" if value else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_paired(summary: dict[str, Any]) -> list[str]:
    """The "Paired against large" table: on the problems both ran, which each solved (problems numbered from 1, as in
    the traces page)."""
    rows = {mode: s for mode, s in summary.items() if mode != "large" and "only_large" in s}
    if not rows:
        return []
    lines = [
        "",
        "Paired against large, on the problems both ran (problem numbers as in traces.html):",
        "",
        "| mode | problems | both solve | only large | only mode | accuracy gained | speed-up per answer | per token |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, s in rows.items():
        only = [
            f"{len(s[k])} ({', '.join(f'#{p + 1}' for p in s[k])})" if s[k] else "0"
            for k in ("only_large", "only_mode")
        ]
        speed = f"{s['paired_speedup']:.2f}×" if "paired_speedup" in s else "–"
        answer = f"{s['paired_answer_speedup']:.2f}×" if "paired_answer_speedup" in s else "–"
        gain = f"{100 * paired_accuracy_gain(s):+.0f} pts"
        lines.append(f"| {mode} | {s['paired']} | {s['both']} | {only[0]} | {only[1]} | {gain} | {answer} | {speed} |")
    front = pareto_front(summary)
    if front:
        lines += ["", "Pareto front (no other mode is both faster and more accurate against large on shared problems):"
                  f" {', '.join(f'`{m}`' for m in front)}."]  # fmt: skip
    return lines


def render_traces(report: dict[str, Any]) -> str:
    parts = [
        "<!doctype html><meta charset='utf-8'><title>relay traces</title>",
        "<style>body{font:14px/1.5 system-ui;max-width:60em;margin:2em auto}pre{white-space:pre-wrap}"
        "span.large{color:#1f6feb}span.small{color:#c026d3;background:#fdf4ff}</style>",
        "<h1>Relay traces</h1><p><span class='large'>large model</span> · <span class='small'>small model</span>"
        " — hover a span for its trigger and token count.</p>",
    ]
    for run in report["runs"]:
        if not is_relay_mode(run["mode"]):
            continue
        verdict = "✓" if run["correct"] else "✗"
        heading = (
            f"#{run['problem'] + 1} {run['mode']} {verdict} (pred {run['predicted']}, ref {run['reference']}, "
            f"{run['completion_tokens']} tokens, {run['seconds']:.1f} s)"
        )
        parts.append(f"<h2>{html.escape(heading)}</h2><pre>")
        for span in run["spans"]:
            title = html.escape(f"{span['model']} · {span['trigger']} · {span['token_count']} tokens")
            parts.append(f"<span class='{span['model']}' title='{title}'>{html.escape(span['text'])}</span>")
        parts.append("</pre>")
    return "".join(parts)


def plot_speed_accuracy(report: dict[str, Any], path: Path) -> None:
    """Accuracy against speed. With ``large`` in the run, every mode is placed against it on the problems the two share
    (speed-up in seconds per token, accuracy gained in points) and the Pareto front is drawn; without it, plain mean
    seconds and accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = report["summary"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    title = f"GSM8K, {report['config']['large']} + {report['config']['small']}"
    if "large" in summary:
        points = {"large": (1.0, 0.0, summary["large"]["n"])}
        points |= {mode: (s.get("paired_answer_speedup", s["paired_speedup"]), 100 * paired_accuracy_gain(s),
                          s["paired"])
                   for mode, s in summary.items() if mode != "large" and "paired_speedup" in s}  # fmt: skip
        front = pareto_front(summary)
        for mode, (speed, gain, n) in points.items():
            ax.scatter(speed, gain, s=60, color="tab:red" if mode in front else "tab:blue", zorder=3)
            ax.annotate(f"{mode} (n={n})", (speed, gain), textcoords="offset points", xytext=(5, 5), fontsize=8)
        ax.plot([points[m][0] for m in front], [points[m][1] for m in front], color="tab:red", alpha=0.5,
                drawstyle="steps-post", label="Pareto front")  # fmt: skip
        ax.axhline(0, color="grey", lw=0.8)
        ax.axvline(1, color="grey", lw=0.8)
        ax.set_xlabel("speed-up vs large (seconds per answer, same problems)")
        ax.set_ylabel("accuracy gained vs large (points, same problems)")
        ax.legend(loc="lower left", fontsize=8)
    else:
        for mode, s in summary.items():
            ax.scatter(s["mean_s"], s["accuracy"] * 100, s=60)
            ax.annotate(mode, (s["mean_s"], s["accuracy"] * 100), textcoords="offset points", xytext=(5, 5))
        ax.set_xlabel("mean seconds per problem")
        ax.set_ylabel("accuracy (%)")
        title += f", n={summary[next(iter(summary))]['n']}"
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
