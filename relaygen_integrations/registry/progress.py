"""The rich progress displays of a fetch: byte bars for downloads / assembly / verification, count bars for
packages, and a conversion spinner that keeps transformers' own tqdm bars from garbling the live display.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)


@contextlib.contextmanager
def conversion_display(console: Console, description: str) -> Iterator[None]:
    """A spinner for the whole conversion plus a rich bar for the tensor dequantization.

    transformers draws its own tqdm bars, which garble a rich live display. Its "Loading weights" /
    "Writing model shards" bars obey ``disable_progress_bar``; the GGUF dequantization loop uses a bare
    ``tqdm`` imported into ``transformers.modeling_gguf_pytorch_utils``, so that one name is swapped for a
    rich-backed tracker while we convert (and left alone if a future transformers moves it).
    """
    import importlib

    from transformers.utils import logging as hf_logging

    with Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        main_task = progress.add_task(description, total=None)
        bars_were_enabled = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            gguf_utils: Any = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
        except ImportError:
            gguf_utils = None
        original = getattr(gguf_utils, "tqdm", None)

        def rich_tqdm(iterable: Any = None, *args: Any, **kwargs: Any) -> Any:
            if iterable is None or args or original is None:  # not the simple loop we know: stay out of it
                return original(iterable, *args, **kwargs) if original is not None else iterable
            total = kwargs.get("total") or (len(iterable) if hasattr(iterable, "__len__") else None)
            return progress.track(iterable, total=total, description="  dequantize GGUF tensors")

        if original is not None:
            gguf_utils.tqdm = rich_tqdm
        try:
            yield
        finally:
            if original is not None:
                gguf_utils.tqdm = original
            if bars_were_enabled:
                hf_logging.enable_progress_bar()
            progress.update(main_task, total=1, completed=1)


def byte_progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def count_progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
