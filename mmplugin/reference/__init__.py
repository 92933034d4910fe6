"""Literal re-implementations of the official formulations: test oracles and speed baselines."""
