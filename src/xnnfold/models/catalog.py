"""The names of the models the report knows, without building or importing them (a leaf
module: no torch, so that the command line rejects an unknown name at once, not after the
imports). The builders are :data:`xnnfold.models.SMALL` / ``LARGE`` and
:data:`xnnfold.models.zoo.ZOO`; ``tests/unit/test_catalog.py`` checks that these names are
exactly their keys."""

SMALL = ("cross-attention", "different-kv", "kdim-vdim", "decoder-layer", "self-attention",
         "weight-norm-conv1d", "lora-linear")
LARGE = ("cross-attention-512", "decoder-layer-512", "self-attention-512",
         "weight-norm-conv1d-256", "lora-linear-1024", "tied-head-decoder")
ZOO = ("whisper-tiny-encoder", "whisper-tiny-decoder", "deit-tiny", "wav2vec2-base", "vit-toy",
       "wav2vec2-toy", "whisper-toy", "nn-transformer")
KNOWN = (*SMALL, *LARGE, *ZOO)


def unknown_model_message(name: str) -> str:
    return (f"unknown model {name!r}; known: {', '.join(KNOWN)}, or package.module:function, "
            "or a .pt2 file")
