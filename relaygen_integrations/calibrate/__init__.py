"""Offline calibration of a pair's switch cues: by the small model's margin (``margins.py``, the paper's rule) and by
what verified relay keeps at measured costs (``verified.py``). Writes the pair's profile.
"""
