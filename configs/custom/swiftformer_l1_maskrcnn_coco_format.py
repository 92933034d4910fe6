# Former path of custom/swiftformer_l1_maskrcnn_20k_coco_format.py; kept so that existing commands keep loading.
_base_ = ['./swiftformer_l1_maskrcnn_20k_coco_format.py']
