"""A transformers processor's output as the inputs executorch's ``MultimodalRunner.generate``
takes: the prompt's token ids cut at each run of the image token, each run given its image in
order (``make_token_input``, ``make_image_input``).

executorch's own ``generate_hf`` takes one image (``pixel_values`` of 3 or 4 dimensions) and one
run. SmolVLM's processor gives ``pixel_values`` of (1, K, C, H, W): with image splitting, K - 1
crops and the global image, each with its own run of image tokens between text tokens
(``<fake_token_around_image><row_1_col_1>``...), each encoded alone, as the .pte's
``vision_encoder`` encodes one image a call; without splitting, K = 1.
"""

from __future__ import annotations

from .runtime import BadInput, cut, image_runs


def images_of(pixel_values) -> list:
    """The images in ``pixel_values``, each (1, C, H, W), in order: (C, H, W) is one image,
    (K, C, H, W) K of them, (1, K, C, H, W) (one prompt's, as SmolVLM's processor gives
    them) K of them; else :class:`BadInput`."""
    shape = tuple(pixel_values.shape)
    if len(shape) == 5 and shape[0] == 1:
        pixel_values = pixel_values[0]
    elif len(shape) == 3:
        pixel_values = pixel_values.unsqueeze(0)
    if pixel_values.dim() != 4:
        raise BadInput(f"pixel_values of shape {shape}: one prompt's images are (C, H, W), "
                       "(K, C, H, W) or (1, K, C, H, W)")
    return [pixel_values[k:k + 1] for k in range(int(pixel_values.shape[0]))]


def runner_inputs(inputs, image_token_id: int) -> list:
    """``inputs`` (a processor's output for one prompt: ``input_ids`` and, with images,
    ``pixel_values``) as the list ``MultimodalRunner.generate`` takes."""
    import torch
    from executorch.extension.llm.runner import make_image_input, make_token_input

    ids = inputs["input_ids"]
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise BadInput(f"input_ids of shape {tuple(inputs['input_ids'].shape)}: one prompt "
                       "(L) or (1, L)")
    pixels = inputs.get("pixel_values")
    images = [] if pixels is None else images_of(pixels)
    tokens = ids.tolist()
    runs = image_runs(tokens, image_token_id)
    if len(runs) != len(images):
        raise BadInput(f"the prompt has {len(runs)} run(s) of image token {image_token_id} "
                       f"and {len(images)} image(s) are given")
    return [make_token_input(value) if kind == "tokens" else
            make_image_input(value.to(torch.float32).contiguous())
            for kind, value in cut(tokens, runs, images)]
