# Former path of swinv2/swinv2_s_cascade_maskrcnn_3x_coco.py; kept so that existing commands keep loading.
_base_ = ['./swinv2/swinv2_s_cascade_maskrcnn_3x_coco.py']
