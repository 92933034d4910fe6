# Former path of swin/swin_b_htcpp_6x_coco.py; kept so that existing commands keep loading.
_base_ = ['./swin/swin_b_htcpp_6x_coco.py']
