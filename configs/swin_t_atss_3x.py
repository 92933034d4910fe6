# Former path of swin/swin_t_atss_3x_coco.py; kept so that existing commands keep loading.
_base_ = ['./swin/swin_t_atss_3x_coco.py']
