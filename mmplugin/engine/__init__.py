"""Training and evaluation components that configs name by type.

* :mod:`.amp`: :class:`AmpOptimWrapper` (mixed precision on any device) and the fp32 convolution backward;
* :mod:`.optim`: the layer-wise learning-rate decay constructor for any plugin backbone;
* :mod:`.ddp`: CPU (gloo) DistributedDataParallel / FSDP wrappers and their timeout;
* :mod:`.fsdp`: the FSDP auto-wrap policy and memory report;
* :mod:`.seg_test_vis`: drawing every test prediction of an mmseg segmentor into a folder (``--show-dir``);
* :mod:`.mmcv_ops`: mmcv's CPU ops in reduced precision.

:mod:`.optim` is imported here (it registers under ``mmplugin``); the others are found through the registries'
``locations`` when a config names them.
"""
from mmplugin.engine import optim  # noqa: F401  (registers the optimizer constructor)
from mmplugin.engine.amp import AmpOptimWrapper, Fp32ConvolutionBackward, default_amp_dtype
from mmplugin.engine.mmcv_ops import install_cpu_reduced_precision_ops

__all__ = ['AmpOptimWrapper', 'Fp32ConvolutionBackward', 'default_amp_dtype', 'install_cpu_reduced_precision_ops']
