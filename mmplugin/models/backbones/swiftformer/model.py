"""SwiftFormer (Shaker et al., ICCV 2023, arXiv 2303.15446) as a dense-prediction backbone.

Parameters and their semantics follow the official release (Amshaker/SwiftFormer, weights of July 2023 and the
earlier generation), so official checkpoints load without conversion steps; the computation is reorganised for
speed without changing the result:

* tensors stay NCHW-logical in ``channels_last`` memory, so the additive attention's token view ``(B, H*W, C)`` is
  a free reshape rather than a permute-copy, and the 1x1 convs run as GEMMs over contiguous channels;
* the global query ``G`` is broadcast against the keys instead of being repeated over all tokens;
* in eval mode every BatchNorm that uses running statistics is folded into its neighbouring conv on the fly,
  and layer scales are folded into the last conv / linear of their branch (exact algebra, ~1e-7 relative);
  ``switch_to_deploy()`` makes those folds permanent.
"""
from __future__ import annotations

import re
from typing import Sequence

import torch
from mmengine.model.weight_init import trunc_normal_
from torch import nn

from mmplugin.models.backbones.arguments import check_int_list
from mmplugin.models.backbones.base import BaseBackbone
from mmplugin.models.backbones.swiftformer.attention import EfficientAdditiveAttention
from mmplugin.models.backbones.swiftformer.blocks import (
    ConvEncoder,
    ConvMlp,
    ConvNormAct,
    LocalRepresentation,
    norm_layer,
)
from mmplugin.models.backbones.swiftformer.converter import convert_swiftformer
from mmplugin.models.layers import (
    DropPath,
    all_finite,
    can_fuse_onednn,
    conv_bn,
    fuse_conv_bn,
    linear_drop_path_rates,
    onednn_fusion_disabled,
    scale_output_,
    uses_running_stats,
)
from mmplugin.models.layers.fusion import add_residual
from mmplugin.models.layers.prepack import prepack_weights
from mmplugin.registry import MODELS
from mmplugin.utils.errors import ConfigTypeError, ConfigValueError

__all__ = ['SwiftFormer', 'SwiftFormerEncoder', 'SwiftFormerStage']


class SwiftFormerEncoder(nn.Module):
    """SwiftFormer encoder (last block of every stage): local representation, additive attention, conv MLP.

    Shapes ``(B, C, H, W)`` in and out. Parameter names follow the official release.
    """

    def __init__(self, dim: int, mlp_ratio: float = 4.0, norm_cfg: dict | None = None, drop_path: float = 0.0,
                 layer_scale_init: float = 1e-5, token_weighting: str = 'l2norm'):
        super().__init__()
        norm_cfg = norm_cfg or dict(type='BN')
        self.local_representation = LocalRepresentation(dim, norm_cfg)
        self.attn = EfficientAdditiveAttention(dim, token_weighting)
        self.linear = ConvMlp(dim, int(dim * mlp_ratio), norm_cfg)
        self.layer_scale_1 = nn.Parameter(torch.full((dim, 1, 1), layer_scale_init))
        self.layer_scale_2 = nn.Parameter(torch.full((dim, 1, 1), layer_scale_init))
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.local_representation(x)
        b, c, h, w = x.shape
        # (B, C, H, W) channels_last -> (B, H*W, C) is a view; otherwise permute copies once.
        tokens = x.permute(0, 2, 3, 1).reshape(b, h * w, c)
        y = self.attn(tokens, self.layer_scale_1).reshape(b, h, w, c).permute(0, 3, 1, 2)
        y = self.drop_path(y)
        # Under autograd out of place: an in-place add on the permuted view makes its backward an as_strided copy
        # that hands the rest of the stage NCHW gradients of channels_last maps, and the BatchNorm / convolution
        # backward with such mixed layouts runs 2-5x slower. At inference in place: one map allocation less.
        x = x + y if torch.is_grad_enabled() else add_residual(y, x)
        return self.linear.forward_residual(x, self.layer_scale_2, self.drop_path)

    @torch.no_grad()
    def switch_to_deploy(self) -> None:
        self.local_representation.switch_to_deploy()
        self.linear.switch_to_deploy(self.layer_scale_2)
        scale_output_(self.attn.final, self.layer_scale_1)
        self.layer_scale_1 = self.layer_scale_2 = None


class SwiftFormerStage(nn.Module):
    """Optional stride-2 downsample, ``depth - 1`` ConvEncoders, one SwiftFormerEncoder."""

    def __init__(self, in_dim: int, dim: int, depth: int, *, downsample: bool, dprs: Sequence[float],
                 mlp_ratio: float, norm_cfg: dict, layer_scale_init: float, token_weighting: str):
        super().__init__()
        self.downsample = ConvNormAct(in_dim, dim, norm_cfg, act=False) if downsample else None
        blocks: list[nn.Module] = [ConvEncoder(dim, mlp_ratio, norm_cfg) for _ in range(depth - 1)]
        blocks.append(SwiftFormerEncoder(dim, mlp_ratio, norm_cfg, dprs[-1], layer_scale_init, token_weighting))
        self.blocks = nn.Sequential(*blocks)


@MODELS.register_module()
class SwiftFormer(BaseBackbone):
    """SwiftFormer backbone returning a 4-level pyramid (strides 4/8/16/32).

    Paper: https://arxiv.org/abs/2303.15446. Weights: official releases (raw, ``'model'`` or ``'state_dict'``
    containers; ``module.`` / ``backbone.`` prefixes), timm's ``swiftformer_*`` and this plugin's own format load
    through ``init_cfg=dict(type='Pretrained', checkpoint=PATH)``.

    Args:
        arch (str | dict): ``'xs' | 's' | 'l1' | 'l3'`` (any case) or ``dict(depths=[4 ints], embed_dims=[4 ints])``.
        in_channels (int): input channels. Defaults to 3.
        out_indices (Sequence[int]): stages to return. Defaults to (0, 1, 2, 3).
        mlp_ratio (float): MLP expansion. Defaults to 4.
        drop_path_rate (float): stochastic depth; as in the official code only the attention block of each stage
            gets ``rate * global_block_index / (total_blocks - 1)``. Defaults to 0.
        layer_scale_init (float): initial attention / MLP layer scale. Defaults to 1e-5.
        token_weighting (str): ``'l2norm'`` (current official weights) or ``'legacy_softmax'`` (weights released
            before July 2023). Defaults to ``'l2norm'``.
        norm_cfg (dict): every BatchNorm inside the network (``dict(type='SyncBN')`` for multi-GPU detection).
            Defaults to ``dict(type='BN')``.
        out_norm_cfg (dict | None): per-output norm (``None`` for none). Defaults to ``dict(type='BN')`` as in the
            official ``fork_feat``.
        frozen_stages (int): -1 none; 0 the stem; i the stem and stages 1..i (with their downsamples and output
            norms). Applied at construction, kept through ``train()``. Defaults to -1.
        norm_eval (bool): keep every BatchNorm in eval mode while training. Defaults to False.
        with_cp (bool): gradient checkpointing per block. Defaults to False.
        channels_last (bool): compute in channels_last memory format (faster on CPU and GPU). Defaults to True.
        copy_classifier_norm (bool): when ``init_cfg`` loads an ImageNet classifier, initialise the last output
            norm ``norm3`` from the classifier's final BatchNorm ``norm``. Defaults to False: ``norm.*`` is ignored
            and ``norm3`` starts fresh (weight 1, bias 0, running mean 0, variance 1), as the official ``fork_feat``
            detection / segmentation backbone loads it. When True, ``out_norm_cfg`` must be set, the model must
            return stage 3 and the checkpoint must hold ``norm.*`` (or ``norm3.*``), else a clear error.
        init_cfg (dict | None): e.g. ``dict(type='Pretrained', checkpoint=PATH)``.
        pretrained (str | None): deprecated OpenMMLab spelling of ``init_cfg`` (see :class:`BaseBackbone`).

    Example:
        >>> import torch
        >>> model = SwiftFormer('xs').eval()
        >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 250, 330))]
        [(1, 48, 63, 83), (1, 56, 32, 42), (1, 112, 16, 21), (1, 220, 8, 11)]
    """

    family = 'swiftformer'
    arch_zoo = {
        'xs': dict(depths=[3, 3, 6, 4], embed_dims=[48, 56, 112, 220]),
        's': dict(depths=[3, 3, 9, 6], embed_dims=[48, 64, 168, 224]),
        'l1': dict(depths=[4, 3, 10, 5], embed_dims=[48, 96, 192, 384]),
        'l3': dict(depths=[4, 4, 12, 6], embed_dims=[64, 128, 320, 512]),
    }
    arch_keys = ('depths', 'embed_dims')
    smoke_arch = dict(depths=[1, 1, 2, 1], embed_dims=[16, 16, 32, 32])
    converter = staticmethod(convert_swiftformer)

    def __init__(self, arch: str | dict = 'l1', in_channels: int = 3, out_indices: Sequence[int] = (0, 1, 2, 3),
                 mlp_ratio: float = 4.0, drop_path_rate: float = 0.0, layer_scale_init: float = 1e-5,
                 token_weighting: str = 'l2norm', norm_cfg: dict | None = None,
                 out_norm_cfg: dict | None = dict(type='BN'), frozen_stages: int = -1, norm_eval: bool = False,
                 with_cp: bool = False, channels_last: bool = True, copy_classifier_norm: bool = False, init_cfg=None,
                 pretrained: str | None = None):
        super().__init__(in_channels=in_channels, out_indices=out_indices, frozen_stages=frozen_stages,
                         norm_eval=norm_eval, with_cp=with_cp, drop_path_rate=drop_path_rate, init_cfg=init_cfg,
                         pretrained=pretrained)
        if not isinstance(copy_classifier_norm, bool):
            raise ConfigTypeError('mmplugin.SwiftFormer: copy_classifier_norm must be a bool, '
                                  f'got {copy_classifier_norm!r}')
        if copy_classifier_norm and not out_norm_cfg:
            raise ConfigValueError('mmplugin.SwiftFormer: copy_classifier_norm=True needs an output norm to copy into; '
                             'out_norm_cfg is None')
        self.copy_classifier_norm = copy_classifier_norm
        settings = self.resolve_arch(arch)
        depths, dims = check_int_list(settings['depths'], 'arch depths', self.num_stages, 1), \
            check_int_list(settings['embed_dims'], 'arch embed_dims', self.num_stages, 2)
        if not isinstance(mlp_ratio, (int, float)) or isinstance(mlp_ratio, bool) or mlp_ratio <= 0:
            raise ConfigValueError(f'mmplugin.SwiftFormer: mlp_ratio must be a positive number, got {mlp_ratio!r}')
        self.arch_name = arch if isinstance(arch, str) else 'custom'
        self.depths, self.embed_dims = depths, dims
        self.channels_last = channels_last
        norm_cfg = dict(norm_cfg or dict(type='BN'))
        self._declare_stages(dims, [2**(i + 2) for i in range(self.num_stages)])

        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, dims[0] // 2, 3, stride=2, padding=1), norm_layer(norm_cfg, dims[0] // 2), nn.ReLU(),
            nn.Conv2d(dims[0] // 2, dims[0], 3, stride=2, padding=1), norm_layer(norm_cfg, dims[0]), nn.ReLU())
        dprs = linear_drop_path_rates(self.drop_path_rate, sum(depths))
        self.stages = nn.ModuleList()
        for i, (depth, dim) in enumerate(zip(depths, dims)):
            start = sum(depths[:i])
            self.stages.append(
                SwiftFormerStage(dims[i - 1] if i else dim, dim, depth, downsample=i > 0,
                                 dprs=dprs[start:start + depth], mlp_ratio=mlp_ratio, norm_cfg=norm_cfg,
                                 layer_scale_init=layer_scale_init, token_weighting=token_weighting))
        self._add_out_norms(lambda c: norm_layer(out_norm_cfg, c) if out_norm_cfg else nn.Identity())
        self._finish_init()
        if channels_last:
            # conv weights in the layout their gradients come in (channels_last activations give channels_last
            # weight gradients): DDP's buckets then need no stride-fixing copies ("Grad strides do not match")
            self.to(memory_format=torch.channels_last)

    @classmethod
    def detect(cls, state_dict) -> bool:
        # The additive attention's w_g exists in every SwiftFormer layout (official, timm, plugin) and in no other
        # family (EfficientFormer shares the official 'network.' / 'patch_embed.' names, ConvNeXt timm's 'stem.').
        return any(k.endswith('attn.w_g') for k in state_dict)

    def _default_init(self) -> None:
        # Official classification init: truncated-normal linears, zero biases; convs keep PyTorch's default.
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def stem_modules(self) -> list[nn.Module]:
        return [self.stem]

    def stage_modules(self, i: int) -> list[nn.Module]:
        return [self.stages[i]]

    def layer_depth(self, name: str) -> int:
        """0 stem; blocks numbered 1..sum(depths) in order; a stage's downsample shares its first block's index and
        an output norm its stage's last block's; anything else ``num_layers - 1``."""
        if name.startswith('stem.'):
            return 0
        m = re.match(r'stages\.(\d+)\.(?:blocks\.(\d+)|downsample)\.', name)
        if m:
            i = int(m.group(1))
            return sum(self.depths[:i]) + int(m.group(2) or 0) + 1
        m = re.match(r'norm(\d+)\.', name)
        if m:
            return sum(self.depths[:int(m.group(1)) + 1])
        return self.num_layers - 1

    @property
    def num_layers(self) -> int:
        return sum(self.depths) + 2

    def converter_kwargs(self) -> dict:
        return dict(copy_classifier_norm=self.copy_classifier_norm)

    def arch_description(self) -> str:
        return f'the model is arch {self.arch_name!r} with embed_dims={self.embed_dims}, depths={self.depths}'

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """As :meth:`BaseBackbone.forward`. An input holding NaN / Inf runs without the oneDNN post-op fusion,
        which would turn NaN into 0: non-finite values propagate as in the reference formulation."""
        if (isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel()
                and can_fuse_onednn(x, self.stem[0].weight) and not all_finite(x)):
            with onednn_fusion_disabled():
                return super().forward(x)
        return super().forward(x)

    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        s = self.stem
        return conv_bn(conv_bn(x, s[0], s[1], 'relu'), s[3], s[4], 'relu')

    def forward_stage(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        stage = self.stages[i]
        if stage.downsample is not None:
            x = stage.downsample(x)
        for blk in stage.blocks:
            x = self.run_block(blk, x)
        return x, x

    @torch.no_grad()
    def switch_to_deploy(self, prepack: bool = True) -> 'SwiftFormer':
        """Fold every foldable BatchNorm and all layer scales into convs / linears (inference only); returns self.

        The weights are constants from here on, so with ``prepack`` (default) the linear and 1x1 convolution weights
        are also frozen for packing (:func:`mmplugin.models.layers.prepack.prepack_weights`): CPU inference keeps
        them in oneDNN's blocked layout (bf16 under bf16 autocast), made on first use, instead of reordering (and
        casting) every weight on every call. Eval mode cannot do this for the weights it folds on every call. This
        is what makes the deployed form faster than eval mode: SwiftFormer-L1 at 800x1216, batch 1, 2 cores of an
        Intel Xeon family 6 model 167, interleaved, 9 rounds: eval 277.3 ms, deployed without packing 272.9 ms,
        deployed 260.5 ms in fp32; 108.6 / 104.7 / 100.7 ms in bf16 autocast (eval with its constant weights
        packed: 272.1 / 106.8 ms). The packed copies take the weights' memory once more (bf16: half); pass
        ``prepack=False`` where memory matters more, or free them with
        :func:`mmplugin.models.layers.prepack.release_prepacked`. Other devices and graph capture (export,
        ``torch.compile``) never read them.
        """
        if not isinstance(prepack, bool):
            raise ConfigTypeError(f'prepack must be True or False, got {prepack!r}')
        if self.training:
            raise RuntimeError('switch_to_deploy() folds running statistics: call model.eval() first')
        for idx in (0, 3):
            if uses_running_stats(self.stem[idx + 1]):
                self.stem[idx] = fuse_conv_bn(self.stem[idx], self.stem[idx + 1])
                self.stem[idx + 1] = nn.Identity()
        for stage in self.stages:
            if stage.downsample is not None:
                stage.downsample.switch_to_deploy()
            for blk in stage.blocks:
                blk.switch_to_deploy()
        if prepack:
            prepack_weights(self)
        return self
