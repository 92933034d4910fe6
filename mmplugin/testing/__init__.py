"""Test support that backbone families outside this repository can use: the conformance checks
(:mod:`.conformance`, needs pytest) and the numeric tolerances and helpers they rely on (:mod:`.numeric`).

Import the submodules directly (``from mmplugin.testing.conformance import ALL_CHECKS``); importing this package
imports neither, so ``import mmplugin`` never needs pytest.
"""
