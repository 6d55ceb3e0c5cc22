"""Which quantity a speed-up, a percentage or a solved count in the docs names, and what a bench run says it is, for
``docs_data.py``.

A bench run holds many speed-ups against ``large`` - per mode, per answer and per token, each as a total and as a
median over problems, on the problems a mode shares with ``large``, and relay's ideal - each mode's shares (accuracy,
drafts accepted, small tokens rejected, the small model's share of the tokens) and its solved problems. A figure that
any of them rounds to is not yet the quantity its text names (issue 44: "2.6×" passed against a run whose headline is
2.50×, as another mode's or another metric's value), so a speed-up figure (``2.50×``), a percentage (``89 %``) or a
solved count (``36/60``) in a block that names a bench run must be the value of:

* **the mode its text names**: in a table row, the first cell before it that is a mode (```relay@generic```,
  ``large-spec#bf16/int8 (the shipped default)``); in prose, the nearest mode its clause names before it, else after it
  (not past the end of a parenthesis the figure stands in), else the nearest before it in the sentence, with the modes
  joined to that one by "and", "or" or a comma. A mode is named in backticks, by the engine's arguments
  (```mode="large"`, `speculative=True```) or as a bare word (``relay-spec is 1.92×``), except the words ``large``,
  ``small`` and ``default``, which prose uses as adjectives, and a word qualified into another mode ("self-speculative
  relay"; "verified relay" stands for every verified mode). A mention after "than", "of", "against", "vs", "over", "as",
  "as under", "to", "beats", "like", "what" or a speed-up is the reference a figure is taken against (``faster than
  `large```, ``1.92× `large```, ``like plain relay``, ``spends what `large-spec` spends``), not what it measures. A name
  stands for the mode of that name, and where the run has none, for the modes that differ from it by a setting or weight
  format (```relay-spec``` for ``relay-spec@32768``, ```large-spec``` for ``large-spec#int8``); after "→" (the block's
  change applied: ``relay-spec 1.65× → 1.78×``) for those variants too. A verify rule in backticks stands for the modes
  verified by it (```prob:0.2```). A bench mode the runs lack backs nothing of theirs (the figure may come from another
  file the block names); where the text names no mode at all, any mode's value of the metric will do.
* **the metric its text names** (speed-ups only): a table column's header, or in prose "per answer" / "per token"
  (or ``s/token``) in the sentence, else in the block; neither or both: either. A total is always a candidate, a median
  over problems only where the text says "median", relay's ideal speed-up only where it says "ideal" - in a table
  column, only what its header says.
* **the share its text names** (percentages only): in a table column, its header's; in prose, the shares its sentence
  names (accuracy: "accuracy", "solves", "correct"; drafts accepted: "accept", "kept"; small tokens rejected:
  "reject", "threw away", "dropped"; the small model's share: "writes", "wrote", "share", "f"; prompt lookup's share:
  "lookup", "copies"); a sentence that names none: any of them.

Not covered: a figure that is not a speed-up against ``large`` of one run (a ratio between two runs or two modes,
quoted with its operands or written by a ``relaygen bench --compare`` command) is left to ``docs_data``'s other rules,
as is a percentage quoted as a quotient (``60-69 % of the time (81 of 135 ms)``); and "N of M" in prose is not a figure
at all (it counts other things too: "differed on 8 of 8 problems").
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from relaygen_integrations.bench.summary import split_format

# Where each speed-up metric lives in a run's summary: over all problems a mode ran, and paired with ``large`` on the
# problems both ran (what a report's "Paired against large" table shows).
METRIC_KEYS: dict[str, tuple[str, ...]] = {
    "answer": ("answer_speedup_vs_large", "paired_answer_speedup"),
    "answer median": ("median_answer_speedup_vs_large",),
    "token": ("speedup_vs_large", "paired_speedup"),
    "token median": ("median_speedup_vs_large",),
    "ideal": ("ideal_speedup",),
}
# Where each share a percentage may be lives in a run's summary (as a fraction of 1), and the words that name it.
SHARE_KEYS: dict[str, tuple[str, ...]] = {
    "accuracy": ("accuracy",),
    "accepted": ("acceptance_rate", "lookup_acceptance_rate"),
    "rejected": ("rejected_share",),
    "small share": ("small_share",),
    "lookup share": ("lookup_share",),
}
SHARE_WORDS: dict[str, re.Pattern[str]] = {
    "accuracy": re.compile(r"accura|\bsolve|correct", re.IGNORECASE),
    "accepted": re.compile(r"accept|\bkept\b", re.IGNORECASE),
    "rejected": re.compile(r"reject|\bthr(?:ew|own|ows) away|\bdropped", re.IGNORECASE),
    "small share": re.compile(r"\bwr(?:ites|ote)\b|\bshare\b|\bf\b", re.IGNORECASE),
    "lookup share": re.compile(r"lookup|\bcop(?:y|ies|ied)\b", re.IGNORECASE),
}
PER_ANSWER = re.compile(r"per answer", re.IGNORECASE)
PER_TOKEN = re.compile(r"per[ -]token|s/token", re.IGNORECASE)
MEDIAN = re.compile(r"median", re.IGNORECASE)
IDEAL = re.compile(r"ideal", re.IGNORECASE)
# A mode written in backticks, or a word that may be one (``relay-spec+verify@prob:0.2#int8``, ``Relay``).
MENTION = re.compile(r"`(?P<code>[^`]+)`|(?<![\w@#:+./`-])(?P<word>[A-Za-z](?:[\w@#:+./-]*\w)?)")
ADJECTIVES = frozenset({"large", "small", "default"})  # modes, but as bare words prose means the model or the setting
# The bench's modes (``bench/run.py``), before a "+verify", "@setting" or "#formats": a name of one of them names a
# mode even where the cited runs lack it (then nothing of theirs backs the figure), so that the mention before it is
# not taken instead. ``test_docs_quantities`` checks that the saved runs use no other.
BENCH_MODES = frozenset({"large", "small", "relay", "reprompt", "relay-spec", "large-spec", "hf-large", "assisted"})
BENCH_MODES |= {"default"}  # a tuned run's engine default (``--modes auto``)
# The engine's own arguments name a mode too: (`mode="large"`, `speculative=True`, `dtype="bf16/int8"`) is
# large-spec#bf16/int8.
ENGINE_ARGUMENTS = re.compile(r'`mode="(?P<mode>[\w-]+)"`(?P<more>(?:,\s*`(?:speculative=True|dtype="[\w/]+")`)*)')
# What a mention after these words names is the reference a speed-up is taken against: "faster than `large`",
# "1.92× `large`"; unless a figure follows its possessive ("against relay's 1.24×").
REFERENCE = re.compile(
    r"(?:\b(?:than|of|against|vs\.?|over|as|to|beats?|like|what)\s+(?:(?:the|plain|bf16|int8|fp32|under)\s+)*"
    r"|\d[×x]\**\s*)\**$"
)
POSSESSIVE_FIGURE = re.compile(r"'s\s+\**\d")
# A bare mode name qualified so that it names another mode: "self-speculative relay" is relay-spec (or one of its
# variants: no mode is taken for it), "verified relay" any verified mode (relay+verify, relay-spec+verify).
QUALIFIED = re.compile(r"(?P<qualifier>self-speculative|(?<!un)verified)\s+$", re.IGNORECASE)
VERIFIED = "+verify"  # the name a "verified relay" stands for: every mode with a verify rule
JOINER = re.compile(r"\s*(?:,|,?\s*and|,?\s*or)\s*")
CLAUSE_END = re.compile(r"[.;:!?](?=\s)|\n(?=\s*[*|-] )")
SENTENCE_END = re.compile(r"(?<=[.;:!?])\s+(?=[A-Z(*`'\"])|\n(?=\s*[*|])")


@dataclass(frozen=True)
class ModeFacts:
    """One mode of one run: its speed-ups against ``large`` by metric (a key of METRIC_KEYS), its shares in percent
    (a key of SHARE_KEYS), and solved/ran."""

    speedups: Mapping[str, tuple[float, ...]]
    solved: tuple[int, int]
    percents: Mapping[str, tuple[float, ...]] = field(default_factory=dict)


def run_modes(saved: Mapping[str, Any]) -> dict[str, ModeFacts]:
    """The modes of a re-rendered ``results.json`` (its summary recomputed from its runs)."""
    correct: dict[str, list[bool]] = {}
    for run in saved["runs"]:
        correct.setdefault(run["mode"], []).append(bool(run["correct"]))
    return {
        mode: ModeFacts(
            {metric: tuple(entry[k] for k in keys if k in entry) for metric, keys in METRIC_KEYS.items()},
            (sum(correct.get(mode, [])), len(correct.get(mode, []))),
            {share: tuple(100 * entry[k] for k in keys if k in entry) for share, keys in SHARE_KEYS.items()},
        )
        for mode, entry in saved["summary"].items()
    }


def bench_mode(name: str) -> str:
    """The bench mode a mode name is a variant of: relay-spec+verify@prob:0.2#int8 -> relay-spec, and
    large-spec+lookup#bf16/int8 -> large-spec."""
    return split_format(name)[0].split("@", 1)[0].removesuffix("+verify").removesuffix("+lookup")


def engine_mode(arguments: re.Match[str]) -> str:
    """The bench mode the engine's arguments run: `mode="large"`, `speculative=True` -> large-spec."""
    speculative = "-spec" if "speculative=True" in arguments["more"] else ""
    formats = re.search(r'dtype="([\w/]+)"', arguments["more"])
    return f"{arguments['mode']}{speculative}" + (f"#{formats[1]}" if formats else "")


def modes_named(name: str, modes: Collection[str], *, variants: bool = False, in_code: bool = True) -> set[str]:
    """The modes of one run that a name written in the docs stands for (see the module docstring)."""
    name = name.strip().lower() if in_code else name.lower()
    if not in_code and name in ADJECTIVES:
        return set()
    if name == VERIFIED:
        return {m for m in modes if VERIFIED in m}
    family = {m for m in modes if m.startswith((f"{name}@", f"{name}#"))}
    if name in modes:
        return {name} | (family if variants else set())
    verified_by = {m for m in modes if in_code and "+verify@" in m and split_format(m)[0].split("@", 1)[1] == name}
    return family | verified_by


@dataclass(frozen=True)
class Mention:
    """A place a text names a mode, and the name as written (or as the engine's arguments spell it)."""

    start: int
    end: int
    name: str
    in_code: bool
    reference: bool  # "than `large`": what a speed-up is measured against


def mentions(text: str, runs: Iterable[Collection[str]]) -> list[Mention]:
    """The places a text names a mode of one of the runs."""
    runs = list(runs)
    found = []
    for m in MENTION.finditer(text):
        name, in_code = (m["code"], True) if m["code"] is not None else (m["word"], False)
        arguments = ENGINE_ARGUMENTS.match(text, m.start())
        qualified = QUALIFIED.search(text[: m.start()]) if not in_code else None
        start = qualified.start() if qualified else m.start()
        if arguments:
            name = engine_mode(arguments)
        elif qualified:
            if name.lower() != "relay" or qualified["qualifier"].lower() != "verified":
                continue
            name = VERIFIED
        elif not in_code and name.lower() in ADJECTIVES:
            continue
        names_mode = bench_mode(name.lower()) in BENCH_MODES or name == VERIFIED
        if names_mode or (in_code and any(modes_named(name, r) for r in runs)):
            reference = bool(REFERENCE.search(text[:start])) and not POSSESSIVE_FIGURE.match(text, m.end())
            found.append(Mention(start, arguments.end() if arguments else m.end(), name, in_code, reference))
    return found


def span_of(text: str, at: int, ends: re.Pattern[str]) -> tuple[int, int]:
    bounds = [0, *(m.end() for m in ends.finditer(text)), len(text)]
    return next(((a, b) for a, b in itertools.pairwise(bounds) if a <= at < b), (0, len(text)))


def named_mentions(text: str, at: int, runs: list[Collection[str]]) -> list[Mention]:
    """The mentions that name what the figure at ``at`` measures (see the module docstring); none if the text names
    no mode."""
    subjects = [m for m in mentions(text, runs) if not m.reference]
    clause, sentence = span_of(text, at, CLAUSE_END), span_of(text, at, SENTENCE_END)
    before = [m for m in subjects if clause[0] <= m.start and m.end <= at]
    # After the figure, only within its own parenthesis: "(... 5 % rejected ...), `relay+verify@greedy` after 11".
    after = [m for m in subjects if at < m.start < clause[1] and not leaves_parenthesis(text[at : m.start])]
    earlier = [m for m in subjects if sentence[0] <= m.start and m.end <= at]
    for pick in (before[-1:], after[:1], earlier[-1:]):
        if pick:
            return joined(text, subjects, pick[0])
    return []


def leaves_parenthesis(between: str) -> bool:
    """Whether text after a figure closes a parenthesis it did not open (the figure's own)."""
    depth = 0
    for char in between:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return True
    return False


def joined(text: str, subjects: list[Mention], picked: Mention) -> list[Mention]:
    """The picked mention with those joined to it by "and", "or" or a comma: "`default` and `large` ... their 0.94×"
    names both."""
    group = [picked]
    for step in (-1, 1):
        i = subjects.index(picked) + step
        while 0 <= i < len(subjects):
            left, right = sorted((group[0] if step < 0 else group[-1], subjects[i]), key=lambda m: m.start)
            if not JOINER.fullmatch(text[left.end : right.start]):
                break
            group = [subjects[i], *group] if step < 0 else [*group, subjects[i]]
            i += step
    return group


@dataclass(frozen=True)
class Quantity:
    """What a figure's text names: the modes (None: any) and, for a speed-up, the metrics it may be; for a percentage,
    the shares."""

    modes: frozenset[str] | None
    metrics: frozenset[str]
    shares: frozenset[str] = frozenset(SHARE_KEYS)


def prose_metrics(sentence: str, block: str) -> frozenset[str]:
    """The metrics a figure in prose may be: per answer / per token as its sentence (else its block) says, medians and
    the ideal only where its sentence says so."""
    said = sentence if PER_ANSWER.search(sentence) or PER_TOKEN.search(sentence) else block
    bases = [b for b, words in (("answer", PER_ANSWER), ("token", PER_TOKEN)) if words.search(said)] or [
        "answer",
        "token",
    ]
    metrics = set(bases) | ({f"{b} median" for b in bases} if MEDIAN.search(sentence) else set())
    return frozenset(metrics | ({"ideal"} if IDEAL.search(sentence) else set()))


def header_metrics(header: str, cell: str) -> frozenset[str]:
    """A table column's metric, from its header; a header that names none (``value``) leaves it to the cell's text."""
    if not (PER_ANSWER.search(header) or PER_TOKEN.search(header) or MEDIAN.search(header) or IDEAL.search(header)):
        return prose_metrics(cell, cell)
    if IDEAL.search(header):
        return frozenset({"ideal"})
    bases = [b for b, words in (("answer", PER_ANSWER), ("token", PER_TOKEN)) if words.search(header)] or [
        "answer",
        "token",
    ]
    return frozenset(f"{b} median" if MEDIAN.search(header) else b for b in bases)


def shares_named(text: str) -> frozenset[str]:
    """The shares a percentage's sentence (or table header) names; all of them where it names none."""
    return frozenset(share for share, words in SHARE_WORDS.items() if words.search(text)) or frozenset(SHARE_KEYS)


def cell_name(cell: str) -> str:
    """A table cell as a mode name: ```large-spec#bf16/int8``` (**the shipped default**) -> large-spec#bf16/int8."""
    return re.sub(r"\s*\(.*\)\s*$", "", cell).replace("`", "").replace("*", "").strip()


def quantity_of(text: str, at: int, runs: list[Collection[str]]) -> Quantity:
    """The quantity the figure at offset ``at`` of a block's ``text`` names, among the modes of ``runs``."""
    line_start = text.rfind("\n", 0, at) + 1
    line = text[line_start : text.find("\n", at) if "\n" in text[at:] else len(text)]
    if line.lstrip().startswith("|"):
        header = next(row for row in text.splitlines() if row.lstrip().startswith("|"))
        column = line[: at - line_start].count("|") - 1
        cells = line.strip().strip("|").split("|")
        header_cells = header.strip().strip("|").split("|")
        header_cell = header_cells[column] if column < len(header_cells) else ""
        metrics, shares = header_metrics(header_cell, cells[column]), shares_named(header_cell)
        for cell in cells[:column]:
            named = set().union(*(modes_named(cell_name(cell), modes) for modes in runs))
            if named:
                return Quantity(frozenset(named), metrics, shares)
        cell_start = line_start + len(line) - len(line.lstrip()) + 1 + sum(len(c) + 1 for c in cells[:column])
        picked = named_mentions(text[cell_start : cell_start + len(cells[column])], at - cell_start, runs)
    else:
        sentence = text[slice(*span_of(text, at, SENTENCE_END))]
        metrics, shares = prose_metrics(sentence, text), shares_named(sentence)
        picked = named_mentions(text, at, runs)
    if not picked:
        return Quantity(None, metrics, shares)
    named: set[str] = set()
    for mention in picked:
        variants = "→" in text[min(mention.end, at) : max(mention.start, at)]
        named.update(*(modes_named(mention.name, m, variants=variants, in_code=mention.in_code) for m in runs))
    return Quantity(frozenset(named), metrics, shares)


def named_values(
    runs: Iterable[Mapping[str, ModeFacts]], quantity: Quantity, by: str, keys: Iterable[str]
) -> list[float]:
    """The values the runs' named modes hold under ``keys`` of their ``by`` table (``speedups`` or ``percents``)."""
    wanted = list(keys)
    return [
        value
        for run in runs
        for mode, facts in run.items()
        if quantity.modes is None or mode in quantity.modes
        for key in wanted
        for value in getattr(facts, by).get(key, ())
    ]


def speedups_of(runs: Iterable[Mapping[str, ModeFacts]], quantity: Quantity) -> list[float]:
    """The runs' values of a speed-up quantity."""
    return named_values(runs, quantity, "speedups", quantity.metrics)


def percents_of(runs: Iterable[Mapping[str, ModeFacts]], quantity: Quantity) -> list[float]:
    """The runs' values, in percent, of a share quantity."""
    return named_values(runs, quantity, "percents", quantity.shares)


def solved_of(runs: Iterable[Mapping[str, ModeFacts]], quantity: Quantity) -> set[tuple[int, int]]:
    """The runs' solved/ran counts of the modes a quantity names."""
    named = [(mode, facts) for run in runs for mode, facts in run.items()]
    return {facts.solved for mode, facts in named if quantity.modes is None or mode in quantity.modes}
