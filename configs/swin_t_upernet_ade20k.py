# Former path of swin/swin_t_upernet_160k_ade20k.py; kept so that existing commands keep loading.
_base_ = ['./swin/swin_t_upernet_160k_ade20k.py']
