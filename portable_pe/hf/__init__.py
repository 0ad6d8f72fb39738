"""Hugging Face models (transformers' own classes) as foreign ONNX exports.

    export.py   export_hf: a model's last hidden state, with or without its KV cache as
                inputs and outputs, to ONNX with a dynamic length (dynamo or TorchScript)
    zoo.py      ARCHITECTURES: tiny configs of the architectures checked, built locally
                (random weights, no hub download)
    vision.py   VISION_ARCHITECTURES and export_vision: tiny vision encoders (ViT, SigLIP,
                DINOv2/v3, BEiT, Pixtral, Swin) exported with a dynamic image size

transformers is a test extra (``pip install -e '.[test]'``); nothing in portable_pe
imports this package unless asked to.
"""
