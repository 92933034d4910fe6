# Former path of swiftformer/swiftformer_xs_maskrcnn_1x_coco.py; kept so that existing commands keep loading.
_base_ = ['./swiftformer/swiftformer_xs_maskrcnn_1x_coco.py']
