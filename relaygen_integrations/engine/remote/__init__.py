"""The remote backend: two OpenAI-compatible completion servers (vLLM, SGLang, llama.cpp, ``relaygen serve --single``)
behind the same ``Backend`` protocol. Needs httpx; imports nothing of the local backend.
"""
