"""Primitives that import nothing else of the package: CPU kernel families (:mod:`.cpu`), error measures
(:mod:`.numerics`), timers (:mod:`.timing`) and the user-error base class (:mod:`.errors`)."""
