"""The ``relaygen`` command line: ``main.py`` builds the parser; one module per command family."""
