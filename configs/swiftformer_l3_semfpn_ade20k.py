# Former path of swiftformer/swiftformer_l3_semfpn_40k_ade20k.py; kept so that existing commands keep loading.
_base_ = ['./swiftformer/swiftformer_l3_semfpn_40k_ade20k.py']
