"""Example handler modules for the flows in ``flows/``."""
