"""The remote backend: two OpenAI-compatible completion servers (tested: vLLM, llama-cpp-python's server,
``relaygen serve --single``) behind the same ``Backend`` protocol. Needs httpx and the ``openai`` SDK (the ``serve``
extra); imports nothing of the local backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from .backend import RemoteBackend


def connect(large: str, small: str | None, tokenizer: str | PreTrainedTokenizerBase, **options: Any) -> RemoteBackend:
    """The backend over two servers (``RelayEngine.from_endpoints``); a missing client library is named with the
    extra that installs it."""
    try:
        from .backend import RemoteBackend
    except ModuleNotFoundError as exc:
        if exc.name not in ("httpx", "openai"):
            raise
        raise ImportError(f"the remote backend needs {exc.name}: pip install relaygen-integrations[serve]") from exc
    return RemoteBackend(large, small, tokenizer, **options)
