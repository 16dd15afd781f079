"""``xnnfold hf`` on an image-text-to-text folder (a tiny LLaVA: CLIP vision tower + Llama,
random weights, a byte-level tokenizer with an ``<image>`` token, LLaVA's processor): the .pte
executorch's ``MultimodalRunner`` runs (:mod:`xnnfold.export.multimodal`), one lowering for the
module; the runner's greedy text against transformers' ``generate`` on the same image and
prompt; ``xnnfold generate --image`` and its one-line errors."""

import json
from pathlib import Path

import numpy
import pytest
import torch

from xnnfold import cli
from xnnfold.export import hf
from xnnfold.export.hf import plan as hf_plan
from xnnfold.usage import UsageError

VOCAB, IMAGE_TOKEN, NEW, PROMPT = 300, 299, 12, "ab cd <image> ef gh ij"


def _tiny_llava(transformers):
    vision = transformers.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=32, patch_size=8, projection_dim=32)
    text = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256, bos_token_id=0,
        eos_token_id=1)
    config = transformers.LlavaConfig(
        vision_config=vision, text_config=text, image_token_id=IMAGE_TOKEN, image_seq_length=16,
        vision_feature_layer=-2, vision_feature_select_strategy="default")
    return transformers.LlavaForConditionalGeneration(config).eval()


def _processor(transformers, folder: Path):
    """LLaVA's processor over a byte-level tokenizer whose last id is ``<image>``."""
    from byte_tokenizer import byte_level_tokenizer
    from tokenizers import AddedToken

    tokenizer = byte_level_tokenizer(folder / "tokenizer.json", VOCAB - 1)
    tokenizer.add_special_tokens([AddedToken("<image>", special=True)])
    tokenizer.save(str(folder / "tokenizer.json"))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), bos_token="<s>", eos_token="</s>")
    images = transformers.CLIPImageProcessor(size={"shortest_edge": 32},
                                             crop_size={"height": 32, "width": 32})
    processor = transformers.LlavaProcessor(
        image_processor=images, tokenizer=fast, patch_size=8,
        vision_feature_select_strategy="default", num_additional_image_tokens=1)
    processor.save_pretrained(str(folder))
    return processor


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    """(model, processor, the processor's inputs, .pte, what xnnfold hf returned)."""
    import transformers
    from PIL import Image

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("llava")
    model = _tiny_llava(transformers)
    model.save_pretrained(str(root / "folder"))
    processor = _processor(transformers, root / "folder")
    image = Image.fromarray(numpy.random.default_rng(0).integers(0, 256, (40, 48, 3),
                                                                 dtype=numpy.uint8))
    inputs = processor(images=image, text=PROMPT, return_tensors="pt")
    pte = root / "out" / "llava.pte"
    pte.parent.mkdir()
    plan = hf_plan.plan(str(root / "folder"), tokens=4, max_cache=64)
    exported = hf.export_folder(plan, str(pte), tokens=4, max_cache=64)
    return model, processor, inputs, pte, exported


def _eager_greedy(model, inputs) -> list:
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def _runner_pieces(pte: Path, inputs) -> list:
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


def test_runner_text_is_eager_greedy(llava):
    """executorch's MultimodalRunner on the .pte and the tokenizer beside it, the processor's
    output of an image and a prompt: its pieces are those of transformers' greedy tokens."""
    from xnnfold.export.llm.text import RunnerTokenizer

    model, _, inputs, pte, exported = llava
    assert not exported.wrong, exported.wrong
    tokens = _eager_greedy(model, inputs)
    assert len(tokens) == NEW and len(set(tokens)) > NEW // 4, tokens
    tokenizer = RunnerTokenizer(pte.parent / "tokenizer.json")
    assert _runner_pieces(pte, inputs) == [tokenizer.piece(t) for t in tokens]


def test_the_image_and_its_place_decide_the_text(llava):
    """Negative: the same tokens with the image's embeddings before them (not at the image
    tokens), or with the image mirrored, give another text: the check above can tell where
    the image went and which it was."""
    from executorch.extension.llm.runner import make_image_input, make_token_input

    _, _, inputs, pte, _ = llava
    ids = inputs["input_ids"][0].tolist()
    text = [t for t in ids if t != IMAGE_TOKEN]
    first = ids.index(IMAGE_TOKEN)
    pixels = inputs["pixel_values"]
    right = _runner_pieces(pte, inputs)
    assert _runner_pieces(pte, [make_image_input(pixels), make_token_input(text)]) != right
    mirrored = [make_token_input(ids[:first]), make_image_input(pixels.flip(-1).contiguous()),
                make_token_input(text[first:])]
    assert _runner_pieces(pte, mirrored) != right


def test_rows_checked_and_the_vision_encoder_delegated(llava):
    """The vision encoder's GEMMs (patch embedding, attention, MLP, projector) and the text
    decoder's all on XNNPACK; every phase's outputs match eager; the runner's command line
    printed."""
    *_, pte, exported = llava
    rows = {(r["part"], r["variant"]): r for r in exported.rows}
    assert set(rows) == {(p, "xnnfold") for p in ("vision_encoder", "prefill", "decode")}
    assert all(r["gemms_outside"] == 0 and r["delegate_calls"] >= 1 for r in rows.values())
    assert all(r["outputs"].startswith("max abs diff") for r in rows.values()), rows
    assert any("MultimodalRunner(" in note and "image_token_id=299" in note
               for note in exported.notes), exported.notes


def test_generate_with_an_image_is_eager_greedy(llava, tmp_path, capsys):
    model, _, inputs, pte, _ = llava
    torch.save(inputs["pixel_values"], tmp_path / "pixels.pt")
    ids = ",".join(str(t) for t in inputs["input_ids"][0].tolist())
    assert cli.main(["generate", str(pte), "--image", str(tmp_path / "pixels.pt"), "--tokens",
                     ids, "--max-new", str(NEW), "--ignore-eos", "--no-warmup"]) == 0
    printed = capsys.readouterr().out
    assert f"generated {NEW}: " + ",".join(map(str, _eager_greedy(model, inputs))) in printed


def test_generate_text_alone_is_eager_greedy(llava, capsys):
    """No --image: the prompt's text alone, as the runner takes a prompt without an image."""
    model, _, inputs, pte, _ = llava
    ids = [t for t in inputs["input_ids"][0].tolist() if t != IMAGE_TOKEN]
    assert cli.main(["generate", str(pte), "--tokens", ",".join(map(str, ids)), "--max-new",
                     str(NEW), "--ignore-eos", "--no-warmup"]) == 0
    with torch.no_grad():
        eager = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=NEW,
                               do_sample=False)[0, len(ids):].tolist()
    assert f"generated {NEW}: " + ",".join(map(str, eager)) in capsys.readouterr().out


@pytest.mark.parametrize("shape, prompt, said", [
    ((1, 3, 24, 24), PROMPT, "an image of shape (1, 3, 24, 24): this .pte's vision encoder "
     "takes one image of 3 x 32 x 32"),
    ((1, 1, 32, 32), PROMPT, "an image of shape (1, 1, 32, 32)"),
    ((1, 3, 32, 32), "ab <image> cd <image> ef", "the prompt has 2 image(s) (runs of image "
     "token 299) and 1 image(s) are given"),
])
def test_a_wrong_image_or_prompt_is_one_line(llava, tmp_path, capsys, shape, prompt, said):
    *_, pte, _ = llava
    torch.save(torch.randn(shape), tmp_path / "pixels.pt")
    assert cli.main(["generate", str(pte), "--image", str(tmp_path / "pixels.pt"), "--prompt",
                     prompt, "--no-warmup"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err, err


def _folder(tmp_path, architecture, model_type, **config):
    (tmp_path / "config.json").write_text(json.dumps(dict(architectures=[architecture],
                                                          model_type=model_type, **config)))
    return str(tmp_path)


def test_a_vision_language_class_without_an_export_is_named(tmp_path):
    """One line, from config.json, naming the class, why (Gemma3) and what is supported."""
    folder = _folder(tmp_path, "Gemma3ForConditionalGeneration", "gemma3",
                     vision_config={}, text_config={})
    with pytest.raises(UsageError, match="Gemma3ForConditionalGeneration \\(model type "
                       "'gemma3'\\) has no image-text-to-text export yet \\(its image "
                       "tokens attend to each other both ways.*\\); supported: "
                       "LlavaForConditionalGeneration"):
        hf_plan.plan(folder)


def test_a_prefill_shorter_than_the_image_is_refused():
    """The runner prefills an image's embeddings in one call: max_prefill below them is one
    line, before torch.export."""
    import transformers

    from xnnfold.export.multimodal.export import export_image_text_to_text

    torch.manual_seed(0)
    with pytest.raises(ValueError, match="max_prefill 8: the runner prefills an image's 16 "
                       "embeddings in one call"):
        export_image_text_to_text(_tiny_llava(transformers), max_cache=64, max_prefill=8)


def test_a_cache_without_room_for_the_check_is_one_line(tmp_path):
    """The check's prompt holds the image's embeddings too: a cache too short for it is
    refused before the lowering, naming the option."""
    import transformers

    from xnnfold.usage import OptionError

    torch.manual_seed(0)
    folder = tmp_path / "folder"
    _tiny_llava(transformers).save_pretrained(str(folder))
    plan = hf_plan.plan(str(folder), tokens=4, max_cache=16)
    with pytest.raises(OptionError, match="tokens 4: the check runs 4 \\+ the image's 16 \\+ "
                       "4 positions, the cache has 16 rows \\(max_cache\\)"):
        hf.export_folder(plan, str(tmp_path / "x.pte"), tokens=4, max_cache=16)
    assert not (tmp_path / "x.pte").exists()


@pytest.mark.parametrize("option, said", [
    (["--no-cache"], "--no-cache: LlavaForConditionalGeneration's .pte for executorch's "
     "MultimodalRunner has a KV cache on XNNPACK"),
    (["--llm-kernels"], "--llm-kernels: LlavaForConditionalGeneration's .pte"),
    (["--quantize", "8da4w"], "--quantize 8da4w: for a causal LM's generation .pte only"),
])
def test_options_of_a_text_pte_alone_are_one_line(tmp_path, capsys, option, said):
    """Refused from config.json, before the weights load (the folder has none)."""
    folder = _folder(tmp_path, "LlavaForConditionalGeneration", "llava",
                     vision_config={}, text_config={"max_position_embeddings": 64})
    assert cli.main(["hf", folder, "-o", str(tmp_path / "x.pte")] + option) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err, err
