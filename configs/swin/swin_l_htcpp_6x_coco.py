# Swin-L HTC++ 6x, COCO, ImageNet-22K initialisation: the Swin paper's system-level row (§4.2, A2.2, Table 2(c):
# 284M params, 1470G FLOPs; 57.1 / 49.5 box / mask AP minival single scale; 58.0 / 50.4 minival and 58.7 / 51.1
# test-dev with multi-scale testing, tools/test.py --tta). HTC with the COCO-stuff semantic branch, 4conv1fc box
# heads, the extra global self-attention layer (mmplugin.GlobalAttentionNeck, 48 heads at C = 1536), InstaBoost,
# 400-1400 multi-scale training, soft-NMS, drop path 0.2. The evidence for each part, and what is still unknown, is
# in configs/_base_/swin_htcpp.py. Needs COCO-stuff stuffthingmaps in data/coco/stuffthingmaps/; without them use
# swin_l_htcpp_nosemantic_6x.py.
_base_ = ['../_base_/swin_htcpp.py']
channels = [192, 384, 768, 1536]
model = dict(
    backbone=dict(
        arch='large',
        init_cfg=dict(type='Pretrained', checkpoint='weights/swin_large_patch4_window7_224_22k.pth')),
    neck=[
        dict(type='mmplugin.GlobalAttentionNeck', in_channels=channels, num_heads=48, drop_path=0.2),
        dict(type='FPN', in_channels=channels, out_channels=256, num_outs=5),
    ])
