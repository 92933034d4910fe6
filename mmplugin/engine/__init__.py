"""Training components that configs name by type: optimizer wrappers (mixed precision on any device)."""
from .amp import AmpOptimWrapper, Fp32ConvolutionBackward, default_amp_dtype
from .mmcv_ops import install_cpu_reduced_precision_ops

__all__ = ['AmpOptimWrapper', 'Fp32ConvolutionBackward', 'default_amp_dtype', 'install_cpu_reduced_precision_ops']
