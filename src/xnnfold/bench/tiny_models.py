"""transformers' model classes built at tiny dims, with sample inputs: what ``xnnfold bench
transformers-sweep`` exports.

:func:`model_classes` lists the classes transformers' auto mappings name (base models, causal
LMs, sequence-to-sequence LMs, vision, audio, classification heads), the most used families
first. :func:`tiny_config` is the config class's own defaults with the sizes shrunk: every
attribute of a known size name is set (hidden sizes, layers, heads, feed-forward, vocabulary,
positions, image size, convolution widths), in nested sub-configs too, so that one function
covers every family without a per-family table. :func:`sample_inputs` builds a forward's inputs
from its parameter names (token ids, pixels, audio samples or features, decoder ids); a class
whose forward needs another input is reported as such, not guessed.
"""

from __future__ import annotations

import inspect

# The families the sweep measures first (transformers' model types), in this order.
PRIORITY = ("bert", "roberta", "distilbert", "albert", "electra", "deberta-v2", "gpt2",
            "gpt_neox", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text",
            "phi", "phi3", "opt", "bloom", "falcon", "mpt", "stablelm", "olmo", "smollm3", "vit",
            "deit", "convnext", "resnet", "swin", "mobilevit", "clip", "siglip", "whisper",
            "wav2vec2", "hubert", "t5", "bart", "marian", "m2m_100")
# auto mappings, by rank: a family's base model, then its main head, then the others.
MAPPINGS = (("MODEL_MAPPING_NAMES",),
            ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
             "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
             "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
             "MODEL_FOR_CTC_MAPPING_NAMES"),
            ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
             "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
             "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"))

HIDDEN, HEADS, LAYERS, FF, VOCAB, POSITIONS, IMAGE = 32, 2, 2, 64, 128, 64, 32
# attribute name -> the tiny value (an int attribute only; lists below)
SIZES = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "n_embed", "embed_dim", "dim",
                     "hidden_dim", "word_embed_proj_dim", "projection_dim", "text_embed_dim",
                     "vision_embed_dim"), HIDDEN),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "n_layers", "num_layers",
                     "encoder_layers", "decoder_layers", "num_decoder_layers"), LAYERS),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "encoder_attention_heads",
                     "decoder_attention_heads"), HEADS),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "multi_query_group_num"), 1),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim",
                     "n_inner", "d_ff", "hidden_dim_ffn"), FF),
    **dict.fromkeys(("head_dim", "d_kv", "attention_head_size"), HIDDEN // HEADS),
    "embedding_size": 16, "vocab_size": VOCAB, "image_size": IMAGE,
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_source_positions",
                     "max_target_positions", "n_ctx"), POSITIONS),
    "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 2,
    "conv_dim": 32, "tdnn_dim": 32, "num_hidden_groups": 1, "sliding_window": 16,
    "attention_window": 16, "rotary_dim": 8, "moe_intermediate_size": FF,
    "ffn_hidden_size": FF, "pooler_hidden_size": HIDDEN, "decoder_vocab_size": VOCAB,
    "window_size": 4, "projection_size": HIDDEN,
}
LIST_SIZES = {"depths": 1, "num_heads": 1, "conv_dim": 32}   # per stage, lengths kept
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
             "sep_token_id", "cls_token_id", "unk_token_id", "mask_token_id")
TOKENS = 8


def model_classes() -> list:
    """``[(class name, model type)]`` of the auto mappings, priority families first (by rank:
    the family's base model, its main heads, then the others), each class once."""
    from transformers.models.auto import modeling_auto

    ranked = []
    for rank, names in enumerate(MAPPINGS):
        for mapping_name in names:
            for model_type, classes in getattr(modeling_auto, mapping_name).items():
                for class_name in (classes if isinstance(classes, tuple) else (classes,)):
                    first = PRIORITY.index(model_type) if model_type in PRIORITY else None
                    ranked.append(((first is None, rank, first or 0, model_type), class_name,
                                   model_type))
    seen, result = set(), []
    for _, class_name, model_type in sorted(ranked, key=lambda row: row[0]):
        if class_name not in seen:
            seen.add(class_name)
            result.append((class_name, model_type))
    return result


def _shrink(config, seen: set) -> None:
    if id(config) in seen:
        return
    seen.add(id(config))
    for name, value in list(vars(config).items()):
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):
            _shrink(value, seen)                                    # a sub-config
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int) and name in SIZES:
            setattr(config, name, min(value, SIZES[name]) if name != "image_size" else IMAGE)
        elif isinstance(value, (list, tuple)) and name in LIST_SIZES and value:
            setattr(config, name, [LIST_SIZES[name]] * len(value))
        elif name in ("hidden_sizes", "neck_hidden_sizes") and isinstance(value, (list, tuple)):
            setattr(config, name, [8 * 2 ** i for i in range(len(value))])
        elif name in TOKEN_IDS and isinstance(value, int) and value >= VOCAB:
            setattr(config, name, 1)
    patch = getattr(config, "patch_size", None)
    if getattr(config, "image_size", None) is not None and isinstance(patch, int):
        config.patch_size = min(patch, IMAGE // 4)          # a few patches per image
    depths = getattr(config, "depths", None)
    if isinstance(depths, list) and isinstance(getattr(config, "embed_dim", None), int):
        # A hierarchical vision model (Swin): a layer per stage, the width doubling per stage,
        # and an image whose last stage still holds a whole window (a smaller one is a case
        # transformers' SDPA path does not size its bias for).
        config.num_layers = len(depths)
        config.hidden_size = config.embed_dim * 2 ** (len(depths) - 1)
        if isinstance(getattr(config, "window_size", None), int) and \
                isinstance(config.patch_size, int):
            config.window_size = 2
            config.image_size = config.patch_size * 2 ** len(depths)


def tiny_config(model_type: str):
    """The config class's defaults with every known size attribute shrunk (sub-configs too)."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    _shrink(config, set())
    for attribute in ("use_cache",):
        if hasattr(config, attribute):
            setattr(config, attribute, False)       # one graph: the forward, no cache out
    return config


def _image_size(config) -> int:
    vision = getattr(config, "vision_config", None) or config
    size = getattr(vision, "image_size", None) or IMAGE
    return size if isinstance(size, int) else size[0]


def sample_inputs(model, generator) -> dict:
    """The forward's inputs, by its parameter names; raises ``LookupError`` naming a required
    parameter the sweep cannot fill."""
    import torch

    config = model.config
    text = getattr(config, "text_config", None) or config
    vocab = getattr(text, "vocab_size", VOCAB) or VOCAB
    parameters = inspect.signature(model.forward).parameters
    ids = lambda n: torch.randint(3, min(vocab, VOCAB), (1, n), generator=generator)  # noqa: E731
    fills = {
        "input_ids": lambda: ids(TOKENS),
        "attention_mask": lambda: torch.ones(1, TOKENS, dtype=torch.long),
        "pixel_values": lambda: torch.randn(1, getattr(getattr(config, "vision_config", config),
                                                       "num_channels", 3),
                                            _image_size(config), _image_size(config),
                                            generator=generator),
        "input_values": lambda: torch.randn(1, 4000, generator=generator),
        "input_features": lambda: torch.randn(1, getattr(config, "num_mel_bins", 80),
                                              2 * getattr(config, "max_source_positions", 32),
                                              generator=generator),
        "decoder_input_ids": lambda: ids(4),
    }
    inputs = {}
    main = getattr(model, "main_input_name", "input_ids")
    for name, parameter in parameters.items():
        if parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
            continue
        wanted = name == main or parameter.default is parameter.empty or (
            name == "attention_mask" and "input_ids" in inputs) or (
            name == "decoder_input_ids" and config.is_encoder_decoder)
        if not wanted:
            continue
        if name not in fills:
            raise LookupError(f"forward needs {name!r}, which the sweep does not build")
        inputs[name] = fills[name]()
    if getattr(config, "text_config", None) is not None and \
            getattr(config, "vision_config", None) is not None:
        for name in ("input_ids", "pixel_values"):          # CLIP-like: both towers
            if name in parameters and name not in inputs:
                inputs[name] = fills[name]()
    return inputs


def redraw_zero_parameters(model, generator) -> int:
    """Parameters initialized to all zeros (biases, zero-init gates) drawn N(0, 0.1): for a model
    whose outputs are then all zero (MobileViT at tiny dims), which no comparison can judge.
    Returns how many were drawn."""
    import torch

    drawn = 0
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.is_floating_point() and not bool(parameter.any()):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
                drawn += 1
    return drawn
