# Former path of custom/swiftformer_l1_semfpn_40k_ade_layout.py; kept so that existing commands keep loading.
_base_ = ['./swiftformer_l1_semfpn_40k_ade_layout.py']
