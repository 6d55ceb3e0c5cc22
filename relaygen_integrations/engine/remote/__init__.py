"""The remote backend: two OpenAI-compatible completion servers (tested: vLLM, llama-cpp-python's server,
``relaygen serve --single``) behind the same ``Backend`` protocol. Needs httpx and the ``openai`` SDK (the ``serve``
extra); imports nothing of the local backend.
"""
