"""mmplugin: SwiftFormer and Swin Transformer V1/V2 backbones for mmdetection and mmsegmentation.

Importing the package registers every model under the ``mmplugin`` scope and makes checkpoint loading safe on
torch >= 2.6 (see :mod:`mmplugin.checkpoint`). A config needs only::

    custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)

It also teaches mmengine the ``mmplugin::`` config prefix
(``_base_ = ['mmplugin::swin/swin_t_maskrcnn_1x_coco.py']``, see :mod:`mmplugin.config_scope`).
"""
import warnings

# mmengine and mmcv import setuptools' pkg_resources, which warns three times on every start-up with setuptools 80
# (nothing a user of the plugin can act on); only that message is silenced, before they are imported
warnings.filterwarnings('ignore', message='pkg_resources is deprecated', category=UserWarning)

from mmplugin.utils.stack import duplicated_packages, missing_packages  # noqa: E402  (metadata only)

if missing_packages():  # one line naming both stacks, before anything imports mmengine
    raise ImportError(f'mmplugin: {missing_packages()}')
if duplicated_packages():
    warnings.warn(f'mmplugin: {duplicated_packages()}', stacklevel=2)

# isort: split
from mmplugin.checkpoint import install_safe_checkpoint_loading  # noqa: E402
from mmplugin.config_scope import config_file, config_root, install_config_scope  # noqa: E402
from mmplugin.registry import MODELS, OPTIM_WRAPPER_CONSTRUCTORS  # noqa: E402
from mmplugin.version import __version__  # noqa: E402

install_safe_checkpoint_loading()
install_config_scope()

from mmplugin import engine, models  # noqa: E402,F401  (registers the backbones, the AMP wrapper, the optimizer constructor)
from mmplugin.loading import install_converting_loader  # noqa: E402
from mmplugin.models.wiring import install_channel_wiring  # noqa: E402

install_converting_loader()
install_channel_wiring()  # in_channels left to the backbone (mmplugin.models.wiring)

__all__ = ['__version__', 'config_file', 'config_root', 'install_config_scope', 'MODELS', 'OPTIM_WRAPPER_CONSTRUCTORS',
           'engine', 'models']
