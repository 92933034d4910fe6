# Former path of custom/swiftformer_l1_retinanet_1x_coco.py; kept so that existing commands keep loading.
_base_ = ['./custom/swiftformer_l1_retinanet_1x_coco.py']
