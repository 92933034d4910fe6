"""Operators with the plugin's own CPU kernels (C sources beside this file, built on first use): ``RoIAlign`` (a
subclass of ``mmcv.ops.RoIAlign``, created on first access; the function itself:
:func:`mmplugin.ops.roi_align.roi_align`)."""

__all__ = ['RoIAlign']  # noqa: F822  (module __getattr__)


def __getattr__(name: str):
    if name == 'RoIAlign':
        from mmplugin.ops.roi_align import layer_class
        return layer_class()
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
