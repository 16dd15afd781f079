"""``xnnfold hf`` on a SmolVLM folder (a tiny SmolVLMForConditionalGeneration: SigLIP vision
tower, pixel-shuffle connector, Llama; random weights; a byte-level tokenizer with SmolVLM's
image tokens): the .pte executorch's ``MultimodalRunner`` runs, one lowering for the module.
The runner's greedy text against transformers' ``generate`` on the same pixel values and
prompt, one image (no splitting, executorch's ``generate_hf``) and an image cut into crops and
a global image (``runner_inputs``); ``xnnfold generate --image``. Without lowering: the vision
encoder's program against transformers' ``get_image_features``.

SmolVLM's processor needs the ``num2words`` package, which the test extra does not bring: the
prompt is expanded with the processor's own function (``get_image_prompt_string``) and the image
processed by its image processor, as the processor does."""

import numpy
import pytest
import torch

from xnnfold import cli
from xnnfold.export import hf
from xnnfold.export.hf import plan as hf_plan

VOCAB, IMAGE_TOKEN, NEW = 300, 299, 12
# SmolVLM's special tokens, the image token last (the config's image_token_id)
FAKE, GLOBAL, IMAGE = "<fake_token_around_image>", "<global-img>", "<image>"
PROMPT = f"ab cd{IMAGE}ef gh ij"
SIDE, PATCH, SCALE = 32, 8, 2              # 16 patches a crop, 4 image tokens after the shuffle
IMAGE_SEQ = (SIDE // PATCH) ** 2 // SCALE ** 2


def _tiny_smolvlm(transformers, side=SIDE, layers=1, scale=SCALE):
    vision = transformers.SmolVLMVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=2,
        image_size=side, patch_size=PATCH)
    text = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256, bos_token_id=0,
        eos_token_id=1)
    config = transformers.SmolVLMConfig(vision_config=vision.to_dict(),
                                        text_config=text.to_dict(), image_token_id=IMAGE_TOKEN,
                                        scale_factor=scale)
    return transformers.SmolVLMForConditionalGeneration(config).eval()


def _tokenizer(transformers, folder):
    from byte_tokenizer import byte_level_tokenizer
    from tokenizers import AddedToken

    tokenizer = byte_level_tokenizer(folder / "tokenizer.json", VOCAB - 3)
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in (FAKE, GLOBAL, IMAGE)])
    tokenizer.save(str(folder / "tokenizer.json"))
    assert tokenizer.token_to_id(IMAGE) == IMAGE_TOKEN
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), bos_token="<s>", eos_token="</s>")


def _inputs(transformers, tokenizer, image, splitting: bool):
    """SmolVLM's processor's output for ``image`` and :data:`PROMPT`: its image processor
    (crops of SIDE px) and its expansion of the image token."""
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    images = transformers.SmolVLMImageProcessor(
        size={"longest_edge": 2 * SIDE}, max_image_size={"longest_edge": SIDE},
        do_image_splitting=splitting)(images=[[image]], return_row_col_info=True,
                                      return_tensors="pt")
    expanded = get_image_prompt_string(images.pop("rows")[0][0], images.pop("cols")[0][0],
                                       IMAGE_SEQ, FAKE, IMAGE, GLOBAL)
    text = tokenizer(PROMPT.replace(IMAGE, expanded), return_tensors="pt")
    return transformers.BatchFeature({"input_ids": text["input_ids"], **images})


def _quadrants(side: int) -> numpy.ndarray:
    """An image whose 2 x 2 crops differ (red, green, blue, grey quadrants), with seeded
    noise: which crop goes to which run changes the model's input, not just its details."""
    colours = numpy.array([[200, 30, 30], [30, 200, 30], [30, 30, 200], [128, 128, 128]])
    half = side // 2
    image = numpy.zeros((side, side, 3))
    for index, colour in enumerate(colours):
        row, col = divmod(index, 2)
        image[row * half:(row + 1) * half, col * half:(col + 1) * half] = colour
    noise = numpy.random.default_rng(0).integers(-50, 50, image.shape)
    return numpy.clip(image + noise, 0, 255).astype(numpy.uint8)


@pytest.fixture(scope="module")
def smolvlm(tmp_path_factory):
    """(model, {splitting: the processor's inputs}, .pte, what xnnfold hf returned)."""
    import transformers
    from PIL import Image

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("smolvlm")
    model = _tiny_smolvlm(transformers)
    model.save_pretrained(str(root / "folder"))
    tokenizer = _tokenizer(transformers, root / "folder")
    image = Image.fromarray(_quadrants(2 * SIDE))
    inputs = {split: _inputs(transformers, tokenizer, image, split) for split in (False, True)}
    pte = root / "out" / "smolvlm.pte"
    pte.parent.mkdir()
    plan = hf_plan.plan(str(root / "folder"), tokens=4, max_cache=128)
    exported = hf.export_folder(plan, str(pte), tokens=4, max_cache=128)
    return model, inputs, pte, exported


def _eager_greedy(model, inputs) -> list:
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def _runner_pieces(pte, inputs) -> list:
    """executorch's MultimodalRunner, greedy: the pieces its callback receives. ``inputs``: a
    BatchFeature for its generate_hf, or a list of MultimodalInput."""
    from executorch.extension.llm.runner import GenerationConfig, MultimodalRunner

    runner = MultimodalRunner(str(pte), str(pte.parent / "tokenizer.json"))
    pieces = []
    config = GenerationConfig(max_new_tokens=NEW, temperature=0.0, echo=False)
    if isinstance(inputs, list):
        runner.generate(inputs, config, pieces.append)
    else:
        runner.generate_hf(inputs, config, image_token_id=IMAGE_TOKEN,
                           token_callback=pieces.append)
    return pieces


def _pieces_of(pte, tokens) -> list:
    from xnnfold.export.llm.text import RunnerTokenizer

    tokenizer = RunnerTokenizer(pte.parent / "tokenizer.json")
    return [tokenizer.piece(t) for t in tokens]


# The tests on the lowered SmolVLM are in the slow set (one 30 s lowering): LLaVA's tests
# cover the runner path they share in make test; the vision program's tests below stay.
@pytest.mark.slow
def test_one_image_in_generate_hf_is_eager_greedy(smolvlm):
    """Without splitting, the processor's pixel values are (1, 1, C, H, W); executorch's
    generate_hf takes them as one image (1, C, H, W) and cuts the prompt at the one run of
    image tokens, between SmolVLM's <fake_token_around_image><global-img> and
    <fake_token_around_image>: its text is transformers' greedy text."""
    model, inputs, pte, exported = smolvlm
    assert not exported.wrong, exported.wrong
    one = inputs[False]
    assert tuple(one["pixel_values"].shape) == (1, 1, 3, SIDE, SIDE)
    tokens = _eager_greedy(model, one)
    assert len(tokens) == NEW and len(set(tokens)) > NEW // 4, tokens
    squeezed = type(one)({"input_ids": one["input_ids"], "pixel_values": one["pixel_values"][0]})
    assert _runner_pieces(pte, squeezed) == _pieces_of(pte, tokens)


@pytest.mark.slow
def test_crops_in_the_runner_are_eager_greedy(smolvlm):
    """With splitting, 2 x 2 crops and the global image, each its own run of image tokens
    between text tokens: runner_inputs gives the runner one image input per run, and its text
    is transformers' greedy text."""
    from xnnfold.export.multimodal import runner_inputs

    model, inputs, pte, _ = smolvlm
    crops = inputs[True]
    assert tuple(crops["pixel_values"].shape) == (1, 5, 3, SIDE, SIDE)
    given = runner_inputs(crops, IMAGE_TOKEN)
    assert len(given) == 11                         # 5 images, 6 text pieces around them
    assert _runner_pieces(pte, given) == _pieces_of(pte, _eager_greedy(model, crops))


@pytest.mark.slow
def test_another_image_or_crop_gives_another_text(smolvlm):
    """Negative: the image mirrored, or its last crop replaced by a copy of the first, change
    the text: the checks above can tell which image, and that every crop is encoded. (Crops
    permuted do not change it: at random weights attention is near uniform, and the same
    embeddings in another order weigh the same.)"""
    from xnnfold.export.multimodal import runner_inputs

    _, inputs, pte, _ = smolvlm
    crops = inputs[True]
    right = _runner_pieces(pte, runner_inputs(crops, IMAGE_TOKEN))
    mirrored = dict(crops, pixel_values=crops["pixel_values"].flip(-1))
    assert _runner_pieces(pte, runner_inputs(mirrored, IMAGE_TOKEN)) != right
    repeated = dict(crops, pixel_values=crops["pixel_values"][:, [0, 1, 2, 0, 4]])
    assert _runner_pieces(pte, runner_inputs(repeated, IMAGE_TOKEN)) != right


@pytest.mark.slow
def test_rows_checked_and_the_vision_encoder_delegated(smolvlm):
    """The vision encoder's GEMMs (patch embedding, attention, MLP, the connector's
    projection) and the text decoder's on XNNPACK; every phase matches eager; the runner's
    command line (runner_inputs) printed."""
    *_, exported = smolvlm
    rows = {(r["part"], r["variant"]): r for r in exported.rows}
    assert set(rows) == {(p, "xnnfold") for p in ("vision_encoder", "prefill", "decode")}
    assert all(r["gemms_outside"] == 0 and r["delegate_calls"] >= 1 for r in rows.values())
    assert all(r["outputs"].startswith("max abs diff") for r in rows.values()), rows
    assert any(f"generate(runner_inputs(inputs, {IMAGE_TOKEN})" in note and
               "do_image_splitting=False" in note for note in exported.notes), exported.notes


@pytest.mark.slow
def test_generate_with_crops_is_eager_greedy(smolvlm, tmp_path, capsys):
    """xnnfold generate --image with the processor's (1, 5, C, H, W) crops and its tokens."""
    model, inputs, pte, _ = smolvlm
    crops = inputs[True]
    torch.save(crops["pixel_values"], tmp_path / "pixels.pt")
    ids = ",".join(str(t) for t in crops["input_ids"][0].tolist())
    assert cli.main(["generate", str(pte), "--image", str(tmp_path / "pixels.pt"), "--tokens",
                     ids, "--max-new", str(NEW), "--ignore-eos", "--no-warmup"]) == 0
    printed = capsys.readouterr().out
    assert f"generated {NEW}: " + ",".join(map(str, _eager_greedy(model, crops))) in printed


@pytest.mark.slow
def test_generate_prompt_with_smolvlm_tokens_is_the_processors(smolvlm, tmp_path, capsys):
    """--prompt with SmolVLM's wrapping tokens written out and <image> where the run goes:
    the runner's tokenizer gives the processor's ids, and the text is eager's."""
    model, inputs, pte, _ = smolvlm
    one = inputs[False]
    torch.save(one["pixel_values"], tmp_path / "pixels.pt")
    prompt = PROMPT.replace(IMAGE, f"{FAKE}{GLOBAL}{IMAGE}{FAKE}")
    assert cli.main(["generate", str(pte), "--image", str(tmp_path / "pixels.pt"), "--prompt",
                     prompt, "--max-new", str(NEW), "--ignore-eos", "--no-warmup"]) == 0
    printed = capsys.readouterr().out
    assert f"generated {NEW}: " + ",".join(map(str, _eager_greedy(model, one))) in printed


@pytest.mark.slow
def test_more_crops_than_runs_is_one_line(smolvlm, tmp_path, capsys):
    _, inputs, pte, _ = smolvlm
    torch.save(inputs[True]["pixel_values"], tmp_path / "pixels.pt")
    assert cli.main(["generate", str(pte), "--image", str(tmp_path / "pixels.pt"), "--prompt",
                     PROMPT, "--no-warmup"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the prompt has 1 image(s) (runs of image token " \
        "299) and 5 image(s) are given" in err, err


@pytest.mark.parametrize("side, scale, in_order", [(SIDE, SCALE, True), (38 * PATCH, 2, False)])
def test_vision_encoder_program_is_get_image_features(side, scale, in_order):
    """The exported vision encoder equals transformers' get_image_features bit for bit, and
    holds no bucketize (no executorch lowering takes it): the position ids are a constant.
    At 38 patches a side transformers' ids are not every position in order (float
    boundaries), so the table is looked up, not added as is."""
    import transformers

    from xnnfold.export.multimodal.export import image_embeddings

    torch.manual_seed(0)
    model = _tiny_smolvlm(transformers, side=side, layers=1, scale=scale)
    vision = image_embeddings(model)
    assert vision.in_order is in_order
    image = torch.randn(1, 3, side, side)
    program = torch.export.export(vision, (image,), strict=True)
    targets = {str(n.target) for n in program.graph.nodes}
    assert not any("bucketize" in t for t in targets), targets
    with torch.no_grad():
        expected = model.get_image_features(image[None]).pooler_output[0]
    assert torch.equal(program.module()(image)[0], expected)


def test_runner_inputs_pairs_runs_and_images():
    """One image input per run, in prompt order; runs and images that differ in number, or a
    batch of prompts, are one line (executorch's runner would take what it is given)."""
    from xnnfold.export.multimodal import BadInput, runner_inputs

    ids = torch.tensor([[5, IMAGE_TOKEN, IMAGE_TOKEN, 6, IMAGE_TOKEN, IMAGE_TOKEN]])
    given = runner_inputs({"input_ids": ids, "pixel_values": torch.zeros(1, 2, 3, 4, 4)},
                          IMAGE_TOKEN)
    assert [repr(g).split("=")[1].rstrip(">") for g in given] == [
        "tokens", "image", "tokens", "image"]
    with pytest.raises(BadInput, match=r"the prompt has 2 run\(s\) of image token 299 and 1 "
                       r"image\(s\) are given"):
        runner_inputs({"input_ids": ids, "pixel_values": torch.zeros(1, 1, 3, 4, 4)},
                      IMAGE_TOKEN)
    with pytest.raises(BadInput, match=r"pixel_values of shape \(2, 2, 3, 4, 4\): one "
                       "prompt's images"):
        runner_inputs({"input_ids": ids, "pixel_values": torch.zeros(2, 2, 3, 4, 4)},
                      IMAGE_TOKEN)
