"""Grammar-constrained decoding: a token mask, from one grammar state per generation, on whichever model writes."""
