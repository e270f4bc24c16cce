"""Drivers that run whole experiments (prepare, train, evaluate, tabulate) of the papers."""
