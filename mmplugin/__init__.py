"""mmplugin: SwiftFormer and Swin Transformer V1/V2 backbones for mmdetection and mmsegmentation.

Importing the package registers every model under the ``mmplugin`` scope and makes checkpoint loading safe on
torch >= 2.6 (see :mod:`mmplugin.checkpoint`). A config needs only::

    custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)
"""
from .version import __version__
from .checkpoint import install_safe_checkpoint_loading
from .registry import MODELS, OPTIM_WRAPPER_CONSTRUCTORS

install_safe_checkpoint_loading()

from . import models, optim  # noqa: E402,F401  (registers the backbones and the optimizer constructor)

__all__ = ['__version__', 'MODELS', 'OPTIM_WRAPPER_CONSTRUCTORS', 'models', 'optim']
