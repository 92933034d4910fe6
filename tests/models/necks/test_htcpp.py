"""HTC++ as the Swin paper built it. The extra global self-attention layer against an independent
formulation (torch.nn.MultiheadAttention with copied weights); the whole-model parameter counts of both HTC++ configs
against the Swin paper's Table 2(c) (284M, 160M, within 1%); one CPU training step of each with the semantic branch;
the COCO-stuff hint of the missing-dataset check; whole-model MAC counting of tools/get_flops.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import randomize_, rel_err
from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm

from mmplugin.models.necks import GlobalAttentionNeck

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / 'configs'
# Swin paper (arXiv 2103.14030) Table 2(c), "#param." column of the HTC++ rows
PAPER_PARAMS = {'swin/swin_l_htcpp_6x_coco.py': 284e6, 'swin/swin_b_htcpp_6x_coco.py': 160e6}


# ------------------------------------------------------------------------------------------------- the module
def _reference(neck: GlobalAttentionNeck, x: torch.Tensor) -> torch.Tensor:
    """The same block written independently: nn.MultiheadAttention for attention, functional norms and MLP."""
    blk = neck.block
    b, c, h, w = x.shape
    mha = torch.nn.MultiheadAttention(c, blk.attn.num_heads, bias=True, batch_first=True).double()
    with torch.no_grad():
        mha.in_proj_weight.copy_(blk.attn.qkv.weight)
        mha.in_proj_bias.copy_(blk.attn.qkv.bias)
        mha.out_proj.weight.copy_(blk.attn.proj.weight)
        mha.out_proj.bias.copy_(blk.attn.proj.bias)
    t = x.flatten(2).transpose(1, 2)
    n1 = F.layer_norm(t, (c, ), blk.norm1.weight, blk.norm1.bias)
    t = t + mha(n1, n1, n1, need_weights=False)[0]
    n2 = F.layer_norm(t, (c, ), blk.norm2.weight, blk.norm2.bias)
    t = t + F.linear(F.gelu(F.linear(n2, blk.mlp.fc1.weight, blk.mlp.fc1.bias)), blk.mlp.fc2.weight, blk.mlp.fc2.bias)
    t = F.layer_norm(t, (c, ), neck.norm.weight, neck.norm.bias)
    return t.transpose(1, 2).reshape(b, c, h, w)


def test_global_attention_matches_multihead_attention():
    torch.manual_seed(0)
    neck = randomize_(GlobalAttentionNeck([16, 32, 48], num_heads=6), seed=1).double().eval()
    feats = tuple(torch.randn(2, c, s, s + 1, dtype=torch.float64) for c, s in ((16, 12), (32, 6), (48, 5)))
    with torch.no_grad():
        out = neck(feats)
        ref = _reference(neck, feats[-1])
    assert out[0] is feats[0] and out[1] is feats[1]  # the other levels pass through untouched
    assert out[2].shape == feats[2].shape
    err = rel_err(out[2], ref)
    assert err < 1e-10, err
    assert not torch.allclose(out[2], feats[2])  # the layer did something


def test_global_attention_is_global_and_trains():
    neck = GlobalAttentionNeck([8, 32], num_heads=4).train()
    x = torch.randn(1, 32, 5, 7, requires_grad=True)
    y = neck((torch.randn(1, 8, 10, 14), x))[-1]
    (y[0, :, 0, 0] * torch.randn(32)).sum().backward()  # one output position depends on every input position
    assert (x.grad.abs().sum(1) > 0).all()
    assert all(p.grad is not None for p in neck.parameters())


def test_global_attention_parameters_are_one_transformer_block():
    # 12 C^2 + 13 C: qkv (3C^2 + 3C), proj (C^2 + C), MLP x4 (8C^2 + 5C), two LayerNorms (4C); + 2C final norm
    for c, heads in ((1536, 48), (1024, 32)):
        neck = GlobalAttentionNeck([c // 8, c], num_heads=heads)
        assert sum(p.numel() for p in neck.parameters()) == 12 * c * c + 13 * c + 2 * c
    neck = GlobalAttentionNeck([64], num_heads=2, final_norm=False)
    assert sum(p.numel() for p in neck.parameters()) == 12 * 64 * 64 + 13 * 64


def test_global_attention_nan_in_nan_out():
    neck = GlobalAttentionNeck([16], num_heads=2).eval()
    x = torch.randn(1, 16, 3, 3)
    x[0, 3, 1, 1] = float('nan')
    assert torch.isnan(neck((x, ))[0]).any()


@pytest.mark.parametrize('kwargs,match', [
    (dict(in_channels=[96, 100], num_heads=8), 'num_heads=8 must be >= 1 and divide'),
    (dict(in_channels=768, num_heads=8), 'in_channels must be a non-empty list'),
    (dict(in_channels=[], num_heads=8), 'in_channels must be a non-empty list'),
    (dict(in_channels=[64], num_heads=4, drop_path=1.0), 'drop_path must be in'),
    (dict(in_channels=[64], num_heads=4, mlp_ratio=0), 'mlp_ratio must be > 0'),
])
def test_global_attention_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GlobalAttentionNeck(**kwargs)


def test_global_attention_rejects_mismatched_inputs():
    neck = GlobalAttentionNeck([8, 16], num_heads=2)
    with pytest.raises(ValueError, match='got 1 levels but in_channels lists 2'):
        neck((torch.randn(1, 16, 2, 2), ))
    with pytest.raises(ValueError, match=r'expects the last level as \(B, 16, H, W\)'):
        neck((torch.randn(1, 8, 4, 4), torch.randn(1, 32, 2, 2)))


# ------------------------------------------------------------------------------------------------- the configs
def _build(name: str):
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    cfg = Config.fromfile(str(CONFIGS / name))
    assert cfg.model.backbone.init_cfg.type == 'Pretrained'
    cfg.model.backbone.init_cfg = None  # tests cannot download the ImageNet-22K weights
    model = revert_sync_batchnorm(MODELS.build(cfg.model))
    model.init_weights()
    return cfg, model


# the quick tier builds and steps Swin-B HTC++; Swin-L (284M parameters) is 'heavy'
@pytest.fixture(scope='module', params=[pytest.param(n, marks=pytest.mark.heavy) if 'swin_l' in n else n
                                        for n in sorted(PAPER_PARAMS)])
def htcpp(request):
    cfg, model = _build(request.param)
    yield request.param, cfg, model
    del model


def test_whole_model_parameters_match_the_paper(htcpp):
    name, _, model = htcpp
    n = sum(p.numel() for p in model.parameters())
    assert abs(n - PAPER_PARAMS[name]) <= 0.01 * PAPER_PARAMS[name], f'{name}: {n / 1e6:.2f}M'
    assert model.roi_head.with_semantic
    assert isinstance(model.neck[0], GlobalAttentionNeck)
    assert model.neck[0].in_channels == list(model.backbone.out_channels)


def _batch(size: int = 64):
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData, PixelData
    s = DetDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size), pad_shape=(size, size),
                                    scale_factor=(1., 1.), batch_input_shape=(size, size), img_id=0))
    gt = InstanceData()
    gt.bboxes = torch.tensor([[6., 8., 40., 50.], [20., 4., 60., 30.]])
    gt.labels = torch.tensor([1, 3])
    masks = torch.zeros(2, size, size, dtype=torch.uint8)
    masks[0, 8:50, 6:40] = 1
    masks[1, 4:30, 20:60] = 1
    gt.masks = BitmapMasks(masks.numpy(), size, size)
    s.gt_instances = gt
    seg = torch.full((1, size, size), 150, dtype=torch.long)  # a COCO-stuff "stuff" label ...
    seg[0, 8:50, 6:40], seg[0, 4:30, 20:60] = 1, 3  # ... and the two things
    s.gt_sem_seg = PixelData(sem_seg=seg)
    return dict(inputs=[torch.randint(0, 255, (3, size, size), dtype=torch.uint8)], data_samples=[s])


def test_one_training_step_on_cpu(htcpp):
    name, _, model = htcpp
    torch.manual_seed(0)
    optim = torch.optim.SGD(model.parameters(), lr=1e-3)
    from mmengine.optim import OptimWrapper
    wrapper = OptimWrapper(optim)
    model.train()
    attn = model.neck[0].block.attn.qkv.weight
    before = attn.detach().clone()
    losses = model.train_step(_batch(), wrapper)
    assert 'loss_semantic_seg' in losses and torch.isfinite(losses['loss_semantic_seg'])
    total = sum(v for k, v in losses.items() if 'loss' in k)
    assert torch.isfinite(total), losses
    assert not torch.equal(attn.detach(), before), 'the global attention layer was not trained'


def test_without_semantic_variant():
    cfg = Config.fromfile(str(CONFIGS / 'swin/swin_l_htcpp_nosemantic_6x_coco.py'))
    assert cfg.model.roi_head.semantic_head is None
    assert 'seg' not in cfg.train_dataloader.dataset.data_prefix
    assert not any(t.get('with_seg') for t in cfg.train_dataloader.dataset.pipeline)
    full = Config.fromfile(str(CONFIGS / 'swin/swin_l_htcpp_6x_coco.py'))
    assert cfg.model.neck == full.model.neck and cfg.model.backbone == full.model.backbone


def test_missing_stuffthingmaps_are_named(tmp_path):
    from mmplugin.cli.datasets import DatasetMissingError, check_datasets
    root = tmp_path / 'coco'
    (root / 'annotations').mkdir(parents=True)
    (root / 'annotations' / 'instances_train2017.json').write_text('{}')
    (root / 'train2017').mkdir()
    for name, stuff in (('swin/swin_l_htcpp_6x_coco.py', True), ('swin/swin_l_htcpp_nosemantic_6x_coco.py', False)):
        cfg = Config.fromfile(str(CONFIGS / name))
        cfg.train_dataloader.dataset.data_root = str(root) + '/'
        if stuff:
            with pytest.raises(DatasetMissingError) as e:
                check_datasets(cfg, splits=('train', ))
            msg = str(e.value)
            assert 'stuffthingmaps/train2017' in msg and 'COCO-stuff' in msg
            assert 'stuffthingmaps_trainval2017.zip' in msg and 'swin/swin_l_htcpp_nosemantic_6x_coco.py' in msg
            assert 'cocodataset.org' not in msg  # the COCO part is there: only COCO-stuff is hinted
            (root / 'stuffthingmaps' / 'train2017').mkdir(parents=True)
        check_datasets(cfg, splits=('train', ))  # complete now: nothing raised


# ------------------------------------------------------------------------------------------------- get_flops
def test_whole_model_macs_count_the_global_attention_layer_and_the_box_heads():
    """The counter's shares equal multiply-adds written out by hand: the global attention layer's, and one more
    proposal's in the three 4conv1fc box heads (the box heads are scaled to --proposals, the mask heads are not)."""
    from mmplugin.analysis import model_complexity
    w, h = 256, 160
    res = model_complexity(str(CONFIGS / 'swin/swin_b_htcpp_6x_coco.py'), (w, h), num_proposals=5, num_mask_rois=5)
    n, c = (w // 32) * (h // 32), 1024
    linear = n * 12 * c * c  # qkv 3C^2, proj C^2, MLP 8C^2 per token
    attention = 2 * n * n * c  # q k^T and attn v
    neck = res['modules']['neck.0']
    assert linear + attention <= neck <= (linear + attention) * 1.005, (neck, linear + attention)  # + LayerNorms
    assert res['params'] == pytest.approx(160e6, rel=0.01)
    assert res['macs'] == sum(res['modules'].values())
    more = model_complexity(str(CONFIGS / 'swin/swin_b_htcpp_6x_coco.py'), (w, h), num_proposals=10, num_mask_rois=5)
    assert more['modules']['backbone'] == res['modules']['backbone']
    per_roi = 4 * 9 * 256 * 256 * 7 * 7 + 256 * 7 * 7 * 1024 + 1024 * (81 + 4)  # 4 convs, fc, cls + class-free reg
    extra = more['modules']['roi_head'] - res['modules']['roi_head']
    assert 5 * 3 * per_roi <= extra <= 5 * 3 * per_roi * 1.005, (extra, 5 * 3 * per_roi)  # + BatchNorms
