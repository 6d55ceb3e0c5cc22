"""Reading the docs' measured figures and the data files behind them, for ``test_docs_data.py``.

The unit of "next to" is a **block**: the text between blank lines (a paragraph, a whole bullet list, a table), code
fences left out. A table block counts together with the block just before it, its caption. A block *names* a data
source when its text holds a ``benchmarks/data/...`` path (a link target counts). A **figure** is a number written
the way this repository writes measurements: a speed-up (``4.47×``, ``2x``), a percentage, a time (``ms``, ``s``,
``min``), a memory size (``GiB``, ``GB``, ...), a pass's cost in one-token steps (``4.51 steps``), an accuracy
difference in points, or a count of solved problems (``37/60``).

A figure is backed by the sources its block names when one of them holds a number that rounds to it at the
precision the doc writes it (``4.5×`` is backed by 4.47; ``94 ms`` by 0.0939 s in a pass-cost JSON, which stores
seconds), or, for a speed-up, a share, a cost in steps or a unitless decimal, when it is the quotient of two backed
numbers of the same sentence (``3.1× cheaper (94 against 293 ms)``), which a reader can check in the sentence itself.
A bench run's speed-ups and solved counts back a figure only as the quantity its text names (``docs_quantities``):
``2.50×`` beside `large-spec#bf16/int8` and "per answer" must be that mode's speed-up per answer, not another mode's
or its median; a speed-up quoted as a quotient beside a run needs operands of one precision. In a block that names
data its unitless decimals count as figures too (``f = 0.35``, a table's tok/s). What a source holds:

* a bench run (a folder with ``results.json``, or its ``report.md`` / ``results.json``): the ``report.md`` that
  ``rerender`` makes from ``results.json`` now and the numbers of its summary, and per mode its speed-ups against
  ``large`` and the problems it solved out of those it ran (``5/11``); a folder of runs, each run's;
* a ``relaygen bench --compare DIR_A DIR_B --compare-mode A,B`` command written in the block: its output;
* a ``benchmarks/pass_cost.py`` JSON: its passes in ms, each pass in one-token steps of its format, each format's pass
  against the other's (``3.1×`` cheaper), the small model's step against the large one's;
* calibration traces (``.jsonl``): the share of completion tokens a draft vocabulary of 16k / 32k / 64k ids covers,
  without and with the prompt's and the special tokens (the raw ids are never matched as text);
* any other file: its text.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from docs_quantities import ModeFacts, percents_of, quantity_of, run_modes, solved_of, speedups_of

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data"
DOC_FILES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))

# A ratio is written right after its number (``1.24×``), which keeps multiplications (``64 × 8``) out; a unit may
# follow a space. A sign (``-18 pts``) is left to the words around it: the comparison ignores it. A number glued to
# a word by a hyphen (``batch-1 step``) is part of a name.
FIGURE = re.compile(
    r"(?<![\w.])[+−-]?(?<!\w[-−])(?P<num>\d+(?:\.\d+)?)"
    r"(?:(?P<ratio>[×x])|\s?(?P<unit>%|ms|s|min|GiB|MiB|KiB|GB|MB|pts|points)"
    r"|\s(?:one-token |decode |int8 |bf16 )?(?P<steps>steps?))(?![\w/])"
)
# A decimal on its own; not a version (``0.32.0``), a name (``Qwen2.5``, ``bf16``) or a setting (``prob:0.2``).
BARE_DECIMAL = re.compile(r"(?<![\w.:@=/-])\d+\.\d+(?![\w.]|\d)")
# Solved problems (``5/11``); chains such as ``1/4/8/32`` positions are not fractions.
FRACTION = re.compile(r"(?<![\w/.])(?P<num>\d+)/(?P<den>\d+)(?![\w/])")
DATA_PATH = re.compile(r"benchmarks/data/[\w./-]*[\w/-]")
MARKED_NUMBER = re.compile(r"(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)(\s?[×x%]|\spts\b)?")
PLAIN_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.]\d)")
COMPARE = re.compile(r"relaygen bench --compare (\S+) (\S+)\s+--compare-mode ([^\s`]+)")
SENTENCE_END = re.compile(r"(?<=[.;:!?])\s+(?=[A-Z(*`'\"])|\n(?=\s*[*|])")
# How a figure's unit may be stored in a data file: a pass-cost JSON holds seconds, a report shares or percentages.
SCALES: dict[str, tuple[float, ...]] = {
    "×": (1.0,),
    "%": (1.0, 100.0),
    "ms": (1.0, 1000.0),
    "s": (1.0, 0.001),
    "min": (1.0, 1 / 60),
    "pts": (1.0,),
    "steps": (1.0,),  # a pass in one-token steps: a pass-cost table's derived ratio, or a printed one
    "": (1.0,),  # a unitless decimal (a share, a ratio, tokens per second) is stored as written
    "GiB": (1.0, 1024.0, 2.0**-30),
    "MiB": (1.0, 1024.0, 2.0**-20),
    "KiB": (1.0, 1024.0, 2.0**-10),
    "GB": (1.0, 1e-9),
    "MB": (1.0, 1e-6),
}
# A number quoted beside a derived figure is usually a time: stored as written, or in seconds.
OPERAND_SCALES = (1.0, 1000.0)


def rounds_to(stored: float, written: float, decimals: int, scales: tuple[float, ...]) -> bool:
    """Whether a stored number, in one of ``scales``, rounds to ``written`` at the ``decimals`` the doc uses."""
    tolerance = 0.5 * 10.0**-decimals + 1e-9
    return any(abs(abs(stored) * scale - written) <= tolerance for scale in scales)


def decimals_of(number: str) -> int:
    return len(number.split(".")[1]) if "." in number else 0


@dataclass(frozen=True)
class Figure:
    text: str  # as written, e.g. "4.47×" or "37/60"
    value: float
    unit: str  # a key of SCALES, or "/" for a fraction
    decimals: int
    den: int = 0  # a fraction's denominator
    start: int = 0  # offset in the block's text

    def matches(self, number: float) -> bool:
        return self.unit != "/" and rounds_to(number, self.value, self.decimals, SCALES[self.unit])


@dataclass
class Block:
    doc: Path
    line: int  # 1-based, the block's first line (the caption's, for a table with one)
    text: str
    sections: tuple[str, ...]  # the headings above it, outermost first
    paths: list[str] = field(default_factory=list)  # the benchmarks/data paths it names, as written

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    @property
    def is_table(self) -> bool:
        return self.text.lstrip().startswith("|")


def figures(text: str, bare: bool = False) -> list[Figure]:
    """The figures of a text; with ``bare`` also its unitless decimals (``f = 0.35``, ``4.32`` tok/s in a table),
    which only the data a block names can vouch for: outside such a block a decimal is as often a setting."""
    found = []
    for m in FIGURE.finditer(text):
        unit = "×" if m["ratio"] else "steps" if m["steps"] else "pts" if m["unit"] == "points" else m["unit"]
        found.append(Figure(m.group(0).lstrip("+−-"), float(m["num"]), unit, decimals_of(m["num"]), 0, m.start()))
    for m in FRACTION.finditer(text):
        found.append(Figure(m.group(0), float(m["num"]), "/", 0, den=int(m["den"]), start=m.start()))
    if bare:
        taken = {f.start + i for f in found for i in range(len(f.text) + 1)}
        found += [
            Figure(m[0], float(m[0]), "", decimals_of(m[0]), 0, m.start())
            for m in BARE_DECIMAL.finditer(text)
            if m.start() not in taken
        ]
    return sorted(found, key=lambda f: f.start)


def blocks(doc: Path) -> list[Block]:
    """The doc's blocks, code fences left out, each table joined to its caption (the block just before it)."""
    out: list[Block] = []
    headings: list[tuple[int, str]] = []
    current: list[str] = []
    start, in_fence = 0, False

    def close() -> None:
        if not current:
            return
        text = "\n".join(current)
        sections = tuple(title for _, title in headings)
        if text.lstrip().startswith("|") and out and out[-1].sections == sections and not out[-1].is_table:
            caption = out.pop()
            out.append(Block(doc, caption.line, caption.text + "\n" + text, sections))
        else:
            out.append(Block(doc, start, text, sections))
        current.clear()

    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            close()
            in_fence = not in_fence
        elif in_fence:
            continue
        elif not line.strip():
            close()
        elif re.match(r"#{1,6} ", line):
            close()
            level = len(line) - len(line.lstrip("#"))
            headings[:] = [h for h in headings if h[0] < level] + [(level, line.lstrip("#").strip())]
        else:
            start = start if current else number
            current.append(line)
    close()
    for block in out:
        block.paths = sorted({p.rstrip(".") for p in DATA_PATH.findall(block.text)})
    return out


def all_blocks() -> Iterator[Block]:
    for doc in DOC_FILES:
        yield from blocks(doc)


def sentence_of(block: Block, figure: Figure) -> str:
    """The sentence (or list item) of the block that holds the figure."""
    bounds = [0, *(m.end() for m in SENTENCE_END.finditer(block.text)), len(block.text)]
    for begin, end in itertools.pairwise(bounds):
        if begin <= figure.start < end:
            return block.text[begin:end]
    return block.text


# -- what a data source says -------------------------------------------------------------------------------------------


def bench_runs(target: Path) -> list[Path]:
    """The bench runs a named path stands for: its own folder (a run, or a run's report.md / results.json), or the
    runs inside a folder of runs."""
    folder = target if target.is_dir() else target.parent
    if (folder / "results.json").is_file() and (target.is_dir() or target.name in ("report.md", "results.json")):
        return [folder]
    return sorted(p.parent for p in target.rglob("results.json")) if target.is_dir() else []


def rerender_copy(run: Path, into: Path) -> Path:
    """``rerender`` on a copy of a saved run under ``into``, so the committed files are not rewritten."""
    from relaygen_integrations.bench.run import rerender

    target = into / run.relative_to(DATA)
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(run / "results.json", target / "results.json")
    rerender(target)
    return target


@cache
def saved_runs(run: Path) -> tuple[dict[str, Any], ...]:
    return tuple(json.loads((run / "results.json").read_text(encoding="utf-8"))["runs"])


def correct_by_mode(run: Path) -> dict[str, dict[int, bool]]:
    """Per mode, per problem it ran: whether its answer was right."""
    by_mode: dict[str, dict[int, bool]] = {}
    for r in saved_runs(run):
        by_mode.setdefault(r["mode"], {})[r["problem"]] = bool(r["correct"])
    return by_mode


def rendered_text(rendered: Path) -> str:
    """A re-rendered run: its report, the scalars of its summary, and per mode "solved/ran" (the report gives
    percentages only)."""
    saved = json.loads((rendered / "results.json").read_text(encoding="utf-8"))
    scalars = [str(v) for s in saved["summary"].values() for v in s.values() if isinstance(v, (int, float))]
    runs: dict[str, list[bool]] = {}
    for r in saved["runs"]:
        runs.setdefault(r["mode"], []).append(bool(r["correct"]))
    solved = [f"{sum(c)}/{len(c)}" for c in runs.values()]
    return "\n".join([(rendered / "report.md").read_text(encoding="utf-8"), " ".join(scalars), " ".join(solved)])


def pass_cost_facts(table: dict[str, Any]) -> list[float]:
    """What a pass-cost table says beside its seconds: passes in one-token steps of their own format, one format's
    pass over another's (how many times cheaper), and the small model's pass over the large one's."""
    seconds: dict[str, dict[str, dict[str, float]]] = table["seconds"]
    facts = []
    for formats in seconds.values():
        for passes in formats.values():
            facts += [t / passes["1"] for t in passes.values()]
        for a in formats.values():
            facts += [a[k] / b[k] for b in formats.values() if b is not a for k in a if k in b]
    if {"large", "small"} <= seconds.keys():
        large = seconds["large"]
        facts += [s[k] / large[f][k] for f, s in seconds["small"].items() if f in large for k in s if k in large[f]]
    return facts


def trace_coverage(traces: Path, special_from: int = 151643) -> list[float]:
    """Shares (%) of the traces' completion tokens among the lowest 16k / 32k / 64k ids, then also counting the
    trace's prompt tokens and the special tokens (ids from ``special_from``: Qwen2.5's added tokens) — what a reduced
    draft vocabulary covers (``engine/local/draft_head.py``)."""
    rows = [json.loads(line) for line in traces.read_text(encoding="utf-8").splitlines() if line.strip()]
    tokens = [(i, set(r["prompt_ids"])) for r in rows for i in r["completion_ids"]]
    shares = []
    for size in (16384, 32768, 65536):
        low = sum(i < size for i, _ in tokens)
        covered = sum(i < size or i >= special_from or i in prompt for i, prompt in tokens)
        shares += [100 * low / len(tokens), 100 * covered / len(tokens)]
    return shares


def source_text(path: str, rendered: dict[Path, Path]) -> str:
    """What one named data path says, as text (see the module docstring), its bench runs left out: ``run_text`` and
    ``run_modes`` say what those hold."""
    target = ROOT / path
    runs = bench_runs(target)
    parts = []
    files = [target] if target.is_file() else sorted(p for p in target.rglob("*") if p.is_file())
    for file in files:
        if any(run in file.parents for run in runs) or file.suffix in (".png", ".html"):
            continue  # a run's own files are stood for by its re-rendering; pictures and pages hold no text to match
        if file.suffix == ".jsonl":
            parts.append(" ".join(f"{share}%" for share in trace_coverage(file)))
        elif file.suffix in (".json", ".txt", ".md"):
            text = file.read_text(encoding="utf-8")
            parts.append(text)
            if file.suffix == ".json" and "seconds" in (table := json.loads(text)):
                parts.append(" ".join(f"{ratio}×" for ratio in pass_cost_facts(table)))
    return "\n".join(parts)


def rendered_modes(rendered: Path) -> dict[str, ModeFacts]:
    """A re-rendered run's modes: their speed-ups by metric and solved counts."""
    return run_modes(json.loads((rendered / "results.json").read_text(encoding="utf-8")))


def compare_text(block: Block) -> str:
    """The output of each ``relaygen bench --compare`` command the block writes."""
    from relaygen_integrations.bench.compare import compare_saved

    outputs = []
    for m in COMPARE.finditer(" ".join(block.text.split())):
        mode_a, _, mode_b = m[3].partition(",")
        outputs.append(compare_saved(ROOT / m[1], ROOT / m[2], mode_a, mode_b or mode_a))
    return "\n".join(outputs)


@dataclass(frozen=True)
class Evidence:
    """The numbers a set of data sources holds. A speed-up is backed only by a number the source writes as a ratio
    (``1.24×``, ``1.27x``; derived ratios are written so), a percentage by one written with ``%`` or by a share
    (a number up to 1), points by points, so that an integer figure does not find its match among unrelated counts.
    A bench run's speed-ups and solved counts back only the figures that name their mode and metric
    (``docs_quantities``); its other numbers back any figure."""

    numbers: tuple[float, ...]
    ratios: tuple[float, ...]
    percents: tuple[float, ...]
    points: tuple[float, ...]
    fractions: frozenset[tuple[int, int]]
    runs: tuple[dict[str, ModeFacts], ...] = ()

    @classmethod
    def of(cls, text: str, run_text: str = "", runs: tuple[dict[str, ModeFacts], ...] = ()) -> Evidence:
        """``text``: what the sources say outside bench runs; ``run_text``: the runs' re-rendered reports, whose
        ratios and fractions are left to ``runs``, their modes."""
        marked = [(float(m[1]), (m[2] or "").strip()) for m in MARKED_NUMBER.finditer(text)]
        every = marked + [(float(m[1]), (m[2] or "").strip()) for m in MARKED_NUMBER.finditer(run_text)]
        return cls(
            numbers=tuple(n for n, _ in every),
            ratios=tuple(n for n, mark in marked if mark in ("×", "x")),
            percents=tuple(n for n, mark in marked if mark == "%") + tuple(100 * n for n, _ in marked if n <= 1),
            points=tuple(n for n, mark in every if mark == "pts"),
            fractions=frozenset((int(m["num"]), int(m["den"])) for m in FRACTION.finditer(text)),
            runs=runs,
        )

    def of_runs(self, figure: Figure, block: Block) -> bool:
        """Whether the bench runs back a speed-up or a solved count as the quantity its text names."""
        if not self.runs:
            return False
        quantity = quantity_of(block.text, figure.start, [list(run) for run in self.runs])
        if figure.unit == "/":
            return (int(figure.value), figure.den) in solved_of(self.runs, quantity)
        if figure.unit == "%":
            return any(rounds_to(n, figure.value, figure.decimals, (1.0,)) for n in percents_of(self.runs, quantity))
        return any(rounds_to(n, figure.value, figure.decimals, (1.0,)) for n in speedups_of(self.runs, quantity))

    def backs(self, figure: Figure, block: Block) -> bool:
        if figure.unit == "/":
            return (int(figure.value), figure.den) in self.fractions or self.of_runs(figure, block)
        typed = {"×": self.ratios, "%": self.percents, "pts": self.points}
        if figure.unit in typed:
            if any(rounds_to(n, figure.value, figure.decimals, (1.0,)) for n in typed[figure.unit]):
                return True
            if figure.unit in ("×", "%") and self.of_runs(figure, block):
                return True
        elif any(figure.matches(n) for n in self.numbers):
            return True
        return self.derived(figure, block)

    def derived(self, figure: Figure, block: Block) -> bool:
        """Whether the figure is the quotient of two numbers its sentence quotes (``3.1× cheaper (94 against 293
        ms)``)."""
        sentence = sentence_of(block, figure)
        if figure.unit not in ("×", "%", "steps", "") or sentence.lstrip().startswith("|"):
            return False  # a table row quotes too many numbers for a quotient of two of them to mean anything
        # Derived in the sentence: the quotient of two numbers it quotes, taken at the values of the data that backs
        # them (the quotient of the rounded numbers can miss the figure's last digit). An operand has two significant
        # digits at least: a "2" (cores) or an "11" of "1-11" would back a quotient of almost anything.
        # Beside a bench run, whose many numbers make such quotients cheap, a speed-up's two operands are quoted at
        # one precision, as a comparison writes them (``4.09 against 2.43``), not ``92.1`` over a count of ``36``.
        quoted = [n for n in PLAIN_NUMBER.findall(sentence) if len(n.replace(".", "").lstrip("0")) >= 2]
        operands = [(decimals_of(n), self.backing(n)) for n in quoted]
        same_precision = figure.unit == "×" and bool(self.runs)
        return any(
            figure.matches(a / b)
            for i, (top_decimals, tops) in enumerate(operands)
            for j, (bottom_decimals, bottoms) in enumerate(operands)
            if i != j and (top_decimals == bottom_decimals or not same_precision)
            for a in tops
            for b in bottoms
            if a != b
        )

    def backing(self, written: str) -> list[float]:
        """The data's values that a number written in the doc stands for (as stored, or in ms for seconds)."""
        value, decimals = float(written), decimals_of(written)
        return [
            n * scale for n in self.numbers for scale in OPERAND_SCALES if rounds_to(n * scale, value, decimals, (1.0,))
        ]
