# Former path of swinv2/swinv2_t_upernet_160k_ade20k.py; kept so that existing commands keep loading.
_base_ = ['./swinv2/swinv2_t_upernet_160k_ade20k.py']
