"""Swin Transformer V1 (Liu et al., ICCV 2021) and V2 (Liu et al., CVPR 2022) dense-prediction backbones.

Both versions share one block (pre-norm for V1, res-post-norm for V2), one stage and one patch merging
(:mod:`.blocks`) and the window machinery in :mod:`.attention` and :mod:`.windows`; the mmdet / mmseg /
mmpretrain keywords are read by :mod:`.keywords`. Feature maps are ``(B, H, W, C)`` inside and
NCHW at the outputs. Parameter names are the official ones (``layers.{i}.blocks.{j}.attn.qkv`` ...), so official
releases load as they are; other layouts go through :mod:`mmplugin.models.backbones.swin.converter`.

Any input size: the image is padded bottom/right to a multiple of the patch size, each block's (normalised for
V1) input to a multiple of the window before the cyclic shift (and cropped after), odd maps before patch merging.
Windows never shrink: maps smaller than the window are padded up and still shifted, as in the official
detection code, so a V1 model equals mmdet's ``SwinTransformer`` with the same weights.
"""
from __future__ import annotations

import inspect
import re
from functools import partial
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mmplugin.models.backbones.arguments import check_int_list
from mmplugin.models.backbones.base import BaseBackbone
from mmplugin.models.backbones.swin.attention import coordinate_window
from mmplugin.models.backbones.swin.blocks import Mlp, PatchMerging, SwinBlock, SwinStage
from mmplugin.models.backbones.swin.converter import convert_swin, num_swin_stages
from mmplugin.models.backbones.swin.keywords import ARCH_NOT_GIVEN, swin_norm_act_problems, translate_swin_kwargs
from mmplugin.models.backbones.swin.patchify import patch_embed
from mmplugin.models.backbones.swin.windows import must_pad, padded_size
from mmplugin.models.layers import linear_drop_path_rates, transformer_init_
from mmplugin.models.layers.layout import contiguous_nchw
from mmplugin.models.layers.low_precision_norm import layer_norm
from mmplugin.registry import MODELS
from mmplugin.utils.errors import ConfigTypeError, ConfigValueError

__all__ = ['SwinTransformer', 'SwinTransformerV2', 'Mlp', 'PatchMerging', 'SwinBlock', 'SwinStage',
           'swin_norm_act_problems']


class _SwinBase(BaseBackbone):
    """Shared implementation; see :class:`SwinTransformer` and :class:`SwinTransformerV2` for the arguments."""

    arch_zoo = {
        **dict.fromkeys(['t', 'tiny'], dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24])),
        **dict.fromkeys(['s', 'small'], dict(embed_dims=96, depths=[2, 2, 18, 2], num_heads=[3, 6, 12, 24])),
        **dict.fromkeys(['b', 'base'], dict(embed_dims=128, depths=[2, 2, 18, 2], num_heads=[4, 8, 16, 32])),
        **dict.fromkeys(['l', 'large'], dict(embed_dims=192, depths=[2, 2, 18, 2], num_heads=[6, 12, 24, 48])),
    }  # yapf: disable
    arch_keys = ('embed_dims', 'depths', 'num_heads')
    smoke_arch = dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4])
    v2 = False

    def __init__(self, arch='tiny', in_channels: int = 3, patch_size: int = 4, window_size=7,
                 pretrained_window_size=0, mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale=None,
                 patch_norm: bool = True, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.1, pad_small_map: bool | None = None, norm_cfg: dict | None = None,
                 act_cfg: dict | None = None, out_indices: Sequence[int] = (0, 1, 2, 3), frozen_stages: int = -1,
                 norm_eval: bool = False, with_cp: bool = False, copy_classifier_norm: bool = False, init_cfg=None,
                 pretrained: str | None = None):
        owner = self.public_name()
        s = self.resolve_arch(arch)
        # the number of stages is len(depths) (mmdet / mmseg meaning, e.g. RTMDet P6's 5-stage Swin); an int is 4
        if isinstance(s['depths'], (list, tuple)):
            if not s['depths']:
                raise ConfigValueError(f'{owner}: arch depths must list the blocks of at least one stage, got '
                                 f'{s["depths"]!r}')
            self.num_stages = len(s['depths'])
        super().__init__(in_channels=in_channels, out_indices=out_indices, frozen_stages=frozen_stages,
                         norm_eval=norm_eval, with_cp=with_cp, drop_path_rate=drop_path_rate, init_cfg=init_cfg,
                         pretrained=pretrained)
        if not isinstance(copy_classifier_norm, bool):
            raise ConfigTypeError(f'{owner}: copy_classifier_norm must be a bool, got {copy_classifier_norm!r}')
        self.copy_classifier_norm = copy_classifier_norm
        if isinstance(s['embed_dims'], bool) or not isinstance(s['embed_dims'], int) or s['embed_dims'] < 1:
            raise ConfigValueError(f'{owner}: arch embed_dims is the stage-1 width, a positive int (later stages '
                                   f'double it), got {s["embed_dims"]!r}')
        dim = s['embed_dims']
        depths = check_int_list(s['depths'], 'arch depths', self.num_stages, 1, owner)
        heads = check_int_list(s['num_heads'], 'arch num_heads', self.num_stages, 1, owner)
        for i, h in enumerate(heads):
            if (dim * 2**i) % h:
                raise ConfigValueError(f'{owner}: stage {i} width {dim * 2**i} is not divisible by num_heads {h}')
        windows = check_int_list(window_size, 'window_size', self.num_stages, 1, owner)
        raw_pre_windows = check_int_list(pretrained_window_size, 'pretrained_window_size', self.num_stages, 0, owner)
        pre_windows = [coordinate_window(p, w) for p, w in zip(raw_pre_windows, windows)]
        if isinstance(patch_size, bool) or not isinstance(patch_size, int) or patch_size < 1:
            raise ConfigValueError(f'{owner}: patch_size must be a positive int, got {patch_size!r}')
        if isinstance(mlp_ratio, bool) or not isinstance(mlp_ratio, (int, float)) or mlp_ratio <= 0:
            raise ConfigValueError(f'{owner}: mlp_ratio must be a positive number, got {mlp_ratio!r}')
        for name, rate in (('drop_rate', drop_rate), ('attn_drop_rate', attn_drop_rate)):
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate < 1.0:
                raise ConfigValueError(f'{owner}: {name} must be a number in [0, 1), got {rate!r}')
        if qk_scale is not None and (self.v2 or isinstance(qk_scale, bool) or not isinstance(qk_scale, (int, float))
                                     or qk_scale <= 0):
            raise ConfigValueError(f'{owner}: qk_scale must be None or a positive number' +
                             (' (Swin V2 uses cosine attention with a learned scale: leave it None)' if self.v2 else '')
                             + f', got {qk_scale!r}')
        if pad_small_map not in (None, True, False):
            raise ConfigValueError(f'{owner}: pad_small_map must be None, True or False, got {pad_small_map!r}')
        norm_requires_grad, problems = swin_norm_act_problems(norm_cfg, act_cfg)
        if problems:
            raise ConfigValueError(f'{owner}: cannot honour ' + '; '.join(problems))
        self.pad_small_map = pad_small_map is not False  # None (default) and True: pad maps smaller than the window
        self.arch_name = arch if isinstance(arch, str) else 'custom'
        self.embed_dims, self.depths, self.num_heads = dim, depths, heads
        self.window_sizes, self.pretrained_window_sizes = windows, pre_windows
        self.patch_size = patch_size
        self._declare_stages([dim * 2**i for i in range(self.num_stages)],
                             [patch_size * 2**i for i in range(self.num_stages)])

        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.patch_embed.norm = nn.LayerNorm(dim) if patch_norm else nn.Identity()
        self.drop_after_pos = nn.Dropout(drop_rate)
        dprs = linear_drop_path_rates(self.drop_path_rate, sum(depths))
        self.layers = nn.ModuleList()
        for i in range(self.num_stages):
            start = sum(depths[:i])
            self.layers.append(
                SwinStage(dim * 2**i, depths[i], heads[i], windows[i], mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                          dprs=dprs[start:start + depths[i]], downsample=i < self.num_stages - 1, v2=self.v2,
                          pretrained_window_size=raw_pre_windows[i], pad_small_map=self.pad_small_map,
                          merge_norm=patch_norm, qk_scale=qk_scale, drop=drop_rate, attn_drop=attn_drop_rate))
        self._add_out_norms(nn.LayerNorm)
        self._finish_init()
        if not norm_requires_grad:  # norm_cfg=dict(type='LN', requires_grad=False): every LayerNorm stays fixed
            for m in self.modules():
                if isinstance(m, nn.LayerNorm):
                    m.requires_grad_(False)

    @classmethod
    def plugin_arguments(cls) -> list[str]:
        """The keyword arguments the plugin's Swin takes as they are (those of :class:`_SwinBase`); other
        libraries' keywords go through :func:`~.swin_keywords.translate_swin_kwargs` first."""
        return [name for name in inspect.signature(_SwinBase.__init__).parameters if name != 'self']

    @classmethod
    def detect(cls, state_dict) -> bool:
        # A window-attention block of the official / timm (layers.i.blocks.j.attn.X) or OpenMMLab
        # (stages.i.blocks.j.attn.w_msa.X) layout; X is the V1 bias table or the V2 CPB MLP.
        return any(cls._DETECT.search(k) for k in state_dict)

    def _default_init(self) -> None:
        transformer_init_(self)
        if self.v2:  # res-post-norms start at zero, so every block starts as the identity (official V2 init)
            for stage in self.layers:
                for blk in stage.blocks:
                    for norm in (blk.norm1, blk.norm2):
                        nn.init.zeros_(norm.weight)
                        nn.init.zeros_(norm.bias)

    def stem_modules(self) -> list[nn.Module]:
        return [self.patch_embed]

    def stage_modules(self, i: int) -> list[nn.Module]:
        return [self.layers[i]]  # includes the patch merging that ends the stage

    def layer_depth(self, name: str) -> int:
        """0 patch embedding; blocks 1..sum(depths) in order; a stage's patch merging and output norm share its last
        block's index; anything else ``num_layers - 1``."""
        if name.startswith('patch_embed.'):
            return 0
        m = re.match(r'layers\.(\d+)\.blocks\.(\d+)\.', name)
        if m:
            return sum(self.depths[:int(m.group(1))]) + int(m.group(2)) + 1
        m = re.match(r'(?:layers\.(\d+)\.downsample|norm(\d+))\.', name)
        if m:
            return sum(self.depths[:int(m.group(1) or m.group(2)) + 1])
        return self.num_layers - 1

    @property
    def num_layers(self) -> int:
        return sum(self.depths) + 2

    def converter_kwargs(self) -> dict:
        return dict(window_sizes=self.window_sizes, copy_classifier_norm=self.copy_classifier_norm)

    def optional_missing_prefixes(self, state_dict=None) -> tuple[str, ...]:
        """The output norms and, for a model deeper than a 4-stage (or deeper) checkpoint, the stages the checkpoint
        does not have and the patch merging into the first of them: e.g. mmdet's 5-stage RTMDet P6 Swin from a
        released 4-stage classifier, whose extra stage starts fresh as in mmdet (``strict=False``). A checkpoint
        with fewer than 4 stages is incomplete, not shallower, and is refused."""
        prefixes = super().optional_missing_prefixes(state_dict)
        k = num_swin_stages(state_dict or {})
        if 4 <= k < self.num_stages:
            prefixes += (f'layers.{k - 1}.downsample.', ) + tuple(f'layers.{j}.' for j in range(k, self.num_stages))
        return prefixes

    def arch_description(self) -> str:
        return (f'the model is {"V2" if self.v2 else "V1"} arch {self.arch_name!r} with embed_dims='
                f'{self.embed_dims}, depths={self.depths}, window_size={self.window_sizes}')

    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        """Pad bottom/right to a multiple of the patch size, embed: ``(B, C, H, W)`` -> ``(B, H/p, W/p, C')``."""
        p = self.patch_size
        h, w = x.shape[-2:]
        if must_pad(h, w, p):
            x = F.pad(x, (0, padded_size(w, p) - w, 0, padded_size(h, p) - h))
        x = patch_embed(x, self.patch_embed.proj)  # (B, H/p, W/p, C'); reduced precision: a GEMM (see patchify.py)
        return self.drop_after_pos(layer_norm(self.patch_embed.norm, x))

    def forward_stage(self, i: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layers[i](x, self.run_block)

    def forward_output(self, i: int, feat: torch.Tensor) -> torch.Tensor:
        # norm on (B, H, W, C), then contiguous NCHW for mmcv's ops
        return contiguous_nchw(layer_norm(getattr(self, f'norm{i}'), feat).permute(0, 3, 1, 2))


@MODELS.register_module()
class SwinTransformer(_SwinBase):
    """Swin Transformer V1 backbone (https://arxiv.org/abs/2103.14030), registered as ``mmplugin.SwinTransformer``.

    Args:
        arch (str | dict): ``'tiny' | 'small' | 'base' | 'large'`` (or ``'t' | 's' | 'b' | 'l'``) or
            ``dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24])``. The length of ``depths`` is the
            number of stages, as in mmdet / mmseg: e.g. RTMDet P6's 5-stage Swin-B ``depths=[2, 2, 18, 2, 1]``,
            ``num_heads=[4, 8, 16, 32, 64]`` (stage ``i`` has width ``embed_dims * 2**i`` and stride
            ``patch_size * 2**i``; the per-stage lists ``num_heads``, ``window_size`` follow that length).
        in_channels (int): input channels. Defaults to 3.
        patch_size (int): patch embedding stride. Defaults to 4.
        window_size (int | list[int]): window per stage. Defaults to 7.
        mlp_ratio (float): MLP expansion. Defaults to 4.
        qkv_bias (bool): bias in qkv. Defaults to True.
        qk_scale (float | None): attention scale; None means ``head_dim ** -0.5``. Defaults to None.
        patch_norm (bool): LayerNorm after the patch embedding and in every patch merging (mmdet / mmseg meaning;
            the official code's ``patch_norm=False`` keeps the merging norms). Defaults to True.
        drop_rate (float): dropout after the patch embedding, the attention projection and in the MLP (official
            and mmdet placement). Defaults to 0.
        attn_drop_rate (float): dropout on the attention probabilities. Defaults to 0.
        drop_path_rate (float): stochastic depth, linear 0 -> rate over all blocks, in [0, 1). Defaults to 0.1.
        pad_small_map (bool | None): None / True (default): maps smaller than the window are padded up and
            still shifted, as the official detection code and mmdet do. False: as the official classification
            code, timm and mmpretrain, a map not larger than the window is attended as one window of its own size
            without shift, so features at the pretraining resolution equal the classifier's. Note mmpretrain's
            default is False.
        norm_cfg (dict | None): ``dict(type='LN'[, requires_grad=False])``; only LayerNorm. Defaults to None (LN).
        act_cfg (dict | None): only ``dict(type='GELU')``. Defaults to None (GELU).
        out_indices (Sequence[int]): stages to return. Defaults to (0, 1, 2, 3).
        frozen_stages (int): -1 none; 0 patch embedding; i patch embedding and stages 1..i (with the patch merging
            that ends them and their output norms). Applied at construction (DDP-safe) and kept through ``train()``.
            mmdet's convention; mmpretrain's ``frozen_stages=k`` is this plugin's ``k + 1``.
        norm_eval (bool): BatchNorm layers in eval mode while training (Swin has none; kept for API parity).
        with_cp (bool): gradient checkpointing per block. Defaults to False.
        copy_classifier_norm (bool): when ``init_cfg`` loads an ImageNet classifier, initialise the output norm of
            its last stage (``norm3``) from the classifier's final ``norm``. Defaults to False: ``norm.*`` is
            ignored and ``norm3`` starts fresh (weight 1, bias 0), as in mmdet / mmseg and the official Swin
            detection and segmentation code, which produced the published fine-tuning results. When True, the
            model must return that stage and the checkpoint must hold ``norm.*`` (or ``norm3.*``), else loading
            fails with a CheckpointError.
        init_cfg (dict | None): e.g. ``dict(type='Pretrained', checkpoint=PATH or URL)``: official V1 releases,
            mmdet / mmseg / mmpretrain / timm layouts, auto-detected; the bias table is resized for another window.
            A model with more stages than a (4-stage) checkpoint loads the checkpoint's stages; the extra stages
            and the patch merging into them start fresh and are logged as newly initialised, as in mmdet.
        pretrained (str | None): deprecated OpenMMLab spelling of ``init_cfg`` (see :class:`BaseBackbone`).

    mmdet / mmseg / mmpretrain keywords (``embed_dims``, ``depths``, ``num_heads``, ``strides``,
    ``convert_weights``, ``pretrain_img_size`` / ``img_size``, ``use_abs_pos_embed``, ``out_after_downsample``,
    ``stage_cfgs``, ``patch_cfg``, ``interpolate_mode``) are read with their home library's meaning; see
    :mod:`mmplugin.models.backbones.swin.keywords`.

    Example:
        >>> import torch
        >>> model = SwinTransformer('tiny', drop_path_rate=0.).eval()
        >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 250, 330))]
        [(1, 96, 63, 83), (1, 192, 32, 42), (1, 384, 16, 21), (1, 768, 8, 11)]
    """

    family = 'swin'
    v2 = False
    converter = staticmethod(partial(convert_swin, version=1))
    _DETECT = re.compile(r'^(?:layers|stages)\.\d+\.blocks\.\d+\.attn\.(?:w_msa\.)?relative_position_bias_table$')

    def __init__(self, arch=ARCH_NOT_GIVEN, window_size=7, **kwargs):
        if 'pretrained_window_size' in kwargs:
            raise ConfigTypeError('mmplugin.SwinTransformer: pretrained_window_size is a Swin V2 option; use '
                            'mmplugin.SwinTransformerV2')
        arch, kwargs = translate_swin_kwargs(type(self), arch, kwargs)
        super().__init__(arch=arch, window_size=window_size, **kwargs)


@MODELS.register_module()
class SwinTransformerV2(_SwinBase):
    """Swin Transformer V2 backbone (https://arxiv.org/abs/2111.09883), registered as ``mmplugin.SwinTransformerV2``.

    Same arguments as :class:`SwinTransformer` (except ``qk_scale``; window_size defaults to 8) plus
    ``pretrained_window_size`` (int for all stages or a list of 4; mmpretrain spells it ``pretrained_window_sizes``;
    0 means "the window actually used"): the window the weights were pretrained with, which normalises the
    continuous position bias coordinates (e.g. ``[12, 12, 12, 6]`` for the official 12to16 / 12to24 fine-tunes).
    Res-post-norm, scaled cosine attention (logit scale clamped at log 100), log-spaced CPB MLP 2->512->heads,
    separate q/v biases, reduction-then-norm patch merging.
    """

    family = 'swinv2'
    v2 = True
    converter = staticmethod(partial(convert_swin, version=2))
    _DETECT = re.compile(r'^(?:layers|stages)\.\d+\.blocks\.\d+\.attn\.(?:w_msa\.)?cpb_mlp\.')

    def __init__(self, arch=ARCH_NOT_GIVEN, window_size=8, **kwargs):
        arch, kwargs = translate_swin_kwargs(type(self), arch, kwargs)
        super().__init__(arch=arch, window_size=window_size, **kwargs)
