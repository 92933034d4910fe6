"""mmplugin: SwiftFormer and Swin Transformer V1/V2 backbones for mmdetection and mmsegmentation.

Importing the package registers every model under the ``mmplugin`` scope and makes checkpoint loading safe on
torch >= 2.6 (see :mod:`mmplugin.checkpoint`). A config needs only::

    custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)

It also teaches mmengine the ``mmplugin::`` config prefix (``_base_ = ['mmplugin::swin_t_maskrcnn_1x.py']``, see
:mod:`mmplugin.config_scope`).
"""
from .version import __version__
from .checkpoint import install_safe_checkpoint_loading
from .config_scope import config_file, config_root, install_config_scope
from .registry import MODELS, OPTIM_WRAPPER_CONSTRUCTORS

install_safe_checkpoint_loading()
install_config_scope()

from . import engine, models, optim  # noqa: E402,F401  (registers the backbones, the AMP wrapper, the optimizer constructor)

__all__ = ['__version__', 'config_file', 'config_root', 'install_config_scope', 'MODELS', 'OPTIM_WRAPPER_CONSTRUCTORS',
           'engine', 'models', 'optim']
