# Former path of swiftformer/swiftformer_xs_semfpn_40k_ade20k.py; kept so that existing commands keep loading.
_base_ = ['./swiftformer/swiftformer_xs_semfpn_40k_ade20k.py']
