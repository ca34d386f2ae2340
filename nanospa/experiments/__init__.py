"""Commands that reproduce the paper's figures and tables: python -m nanospa.experiments NAME."""
