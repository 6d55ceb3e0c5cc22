"""OpenAI-compatible HTTP servers: the relay engine (``app.py``), one model as a completion server (``single.py``), and
what both share (``http.py``).
"""
