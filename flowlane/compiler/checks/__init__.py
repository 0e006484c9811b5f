"""The semantic checks of the compiler, one module per kind of document (``analyze.py`` runs
them); what they share of the project is ``shared.py``."""
