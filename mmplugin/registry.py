"""The plugin's registry node.

``MODELS`` is a child of mmengine's root model registry with scope ``mmplugin``, so mmdet's and mmseg's registries
(siblings under the same root) resolve ``type='mmplugin.SwiftFormer'`` without any copy of the classes being
registered into their own tables. The scope prefix keeps our ``SwinTransformer`` apart from mmdet's, mmseg's and
mmpretrain's classes of the same name.
"""
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import Registry

MODELS = Registry('model', parent=MMENGINE_MODELS, scope='mmplugin', locations=['mmplugin.models'])

__all__ = ['MODELS']

from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS as MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS  # noqa: E402

OPTIM_WRAPPER_CONSTRUCTORS = Registry('optimizer wrapper constructor', parent=MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS,
                                      scope='mmplugin', locations=['mmplugin.engine.optim'])

__all__ += ['OPTIM_WRAPPER_CONSTRUCTORS']

from mmengine.registry import MODEL_WRAPPERS as MMENGINE_MODEL_WRAPPERS  # noqa: E402

MODEL_WRAPPERS = Registry('model_wrapper', parent=MMENGINE_MODEL_WRAPPERS, scope='mmplugin',
                          locations=['mmplugin.engine.ddp'])

__all__ += ['MODEL_WRAPPERS']

from mmengine.registry import HOOKS as MMENGINE_HOOKS  # noqa: E402

HOOKS = Registry('hook', parent=MMENGINE_HOOKS, scope='mmplugin', locations=['mmplugin.engine.seg_test_vis'])

__all__ += ['HOOKS']

from mmengine.registry import FUNCTIONS as MMENGINE_FUNCTIONS  # noqa: E402

FUNCTIONS = Registry('function', parent=MMENGINE_FUNCTIONS, scope='mmplugin', locations=['mmplugin.engine.fsdp'])

__all__ += ['FUNCTIONS']

from mmengine.registry import OPTIM_WRAPPERS as MMENGINE_OPTIM_WRAPPERS  # noqa: E402

OPTIM_WRAPPERS = Registry('optim_wrapper', parent=MMENGINE_OPTIM_WRAPPERS, scope='mmplugin',
                          locations=['mmplugin.engine'])

__all__ += ['OPTIM_WRAPPERS']

from mmengine.registry import STRATEGIES as MMENGINE_STRATEGIES  # noqa: E402

STRATEGIES = Registry('strategy', parent=MMENGINE_STRATEGIES, scope='mmplugin', locations=['mmplugin.engine.ddp'])

__all__ += ['STRATEGIES']
