# Former path of swin/swin_l_htcpp_nosemantic_6x_coco.py; kept so that existing commands keep loading.
_base_ = ['./swin/swin_l_htcpp_nosemantic_6x_coco.py']
