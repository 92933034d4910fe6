# Swin-B HTC++ 6x, COCO, ImageNet-22K initialisation: the Swin paper's Table 2(c) row (160M params, 1043G FLOPs;
# 56.4 / 49.1 box / mask AP minival, single scale; A2.2 for the recipe). The same model as swin_l_htcpp_6x.py at the
# Swin-B width: the extra global self-attention layer has 32 heads at C = 1024. The evidence for each part, and what
# is still unknown, is in configs/_base_/swin_htcpp.py. Needs COCO-stuff stuffthingmaps in data/coco/stuffthingmaps/.
_base_ = ['../_base_/swin_htcpp.py']
channels = [128, 256, 512, 1024]
model = dict(
    backbone=dict(
        arch='base',
        init_cfg=dict(type='Pretrained', checkpoint='weights/swin_base_patch4_window7_224_22k.pth')),
    neck=[
        dict(type='mmplugin.GlobalAttentionNeck', in_channels=channels, num_heads=32, drop_path=0.2),
        dict(type='FPN', in_channels=channels, out_channels=256, num_outs=5),
    ])
