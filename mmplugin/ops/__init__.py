"""Operators with the plugin's own CPU kernels (C sources beside this file, built on first use):
:class:`RoIAlign` (the function itself: :func:`mmplugin.ops.roi_align.roi_align`)."""
from mmplugin.ops.roi_align import RoIAlign

__all__ = ['RoIAlign']
