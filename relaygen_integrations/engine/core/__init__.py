"""The backend-independent core of the engine: the ``Backend`` protocol, settings and plans, the one generation loop
(``drive``), the transcript, the switching policy and its cues, verification rules, spans and events, prompt
rendering and the pair's identity. It imports neither backend package (``local``, ``remote``).
"""
