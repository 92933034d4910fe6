# Former path of swin/swin_s_cascade_maskrcnn_3x_coco.py; kept so that existing commands keep loading.
_base_ = ['./swin/swin_s_cascade_maskrcnn_3x_coco.py']
