# Former path of swin/swin_b_upernet_160k_ade20k.py; kept so that existing commands keep loading.
_base_ = ['./swin/swin_b_upernet_160k_ade20k.py']
