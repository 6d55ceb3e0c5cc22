"""``relaygen bench``: the run (``run.py``), its summary (``summary.py``), its outputs (``report.py``) and the
comparison of two saved runs (``compare.py``).
"""
