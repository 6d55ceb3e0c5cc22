"""The local backend: two in-process transformers models, one KV cache each, the sampler, speculative drafting, the
weight formats and model loading. A new backend is a sibling folder like this one plus one constructor on the front.
"""
