"""``xnnfold hf --quantize``'s weights quantized as they are read (export/hf/streaming.py), at
tiny dims, without lowering: the model is the one ``from_pretrained`` then ``quantize_linears``
give, bit for bit; each tensor is read once, and the float32 weights read are never alive
together beyond about one layer's; a folder it cannot read so is said and loaded whole."""

import gc

import pytest
import torch

from xnnfold.export.hf import streaming
from xnnfold.export.llm.quantize import is_quantized, quantize_linears

LAYERS = 3


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tied Llama saved in bfloat16, as models are published."""
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                            num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                            tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("tied-llama")
    tf.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    return path


def _streamed(folder):
    import transformers as tf

    config = tf.AutoConfig.from_pretrained(folder, local_files_only=True)
    return streaming.load_quantized(tf.LlamaForCausalLM, folder, config, "sdpa", "8da4w")


def _same(x, y) -> bool:
    if type(x) is not type(y):
        return False
    if type(x) is torch.Tensor or type(x) is torch.nn.Parameter:
        return x.dtype == y.dtype and torch.equal(x, y)
    names, _ = x.__tensor_flatten__()                 # torchao's quantized weight
    return all(torch.equal(getattr(x, name), getattr(y, name)) for name in names)


def test_quantized_as_read_is_loading_whole_then_quantizing_bit_for_bit(folder):
    import transformers as tf

    whole = tf.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                attn_implementation="sdpa").eval()
    assert quantize_linears(whole, "8da4w") == 7 * LAYERS + 1         # the tied head too
    streamed = _streamed(folder)
    assert is_quantized(streamed) and not streamed.training
    expected, got = whole.state_dict(), streamed.state_dict()
    assert sorted(got) == sorted(expected)
    assert [name for name in expected if not _same(expected[name], got[name])] == []
    buffers = dict(streamed.named_buffers())         # rotary frequencies: not in a state dict
    assert buffers and all(torch.equal(b, buffers[n]) for n, b in whole.named_buffers())
    # the embedding stays float32, the tied head is quantized apart from it, as in the whole
    assert streamed.model.embed_tokens.weight.dtype == torch.float32
    assert streamed.generation_config.to_dict() == whole.generation_config.to_dict()
    ids = torch.randint(0, 256, (1, 9))
    with torch.no_grad():
        assert torch.equal(streamed(ids).logits, whole(ids).logits)


def _float32_alive(read: dict) -> set:
    """The data pointers of ``read`` (tensors the loader read) that a tensor of this process
    still holds: every tensor object the garbage collector knows, whoever refers to it (of the
    shape read there: not a later tensor at a freed address)."""
    plain = (torch.Tensor, torch.nn.Parameter)
    return {obj.data_ptr() for obj in gc.get_objects()
            if type(obj) in plain and not obj.is_meta and obj.data_ptr() in read and
            tuple(obj.shape) == read[obj.data_ptr()][2]}


def test_each_tensor_is_read_once_and_the_float32_weights_never_all_alive(folder, monkeypatch):
    """At each read, the float32 tensors read earlier that are still alive anywhere in the
    process, less those the loaded model keeps (embedding, norms): the linears' float32
    weights, each dropped once quantized, weigh at most one layer's. Reading every weight
    before quantizing holds all the layers'."""
    read, names, alive = {}, [], []
    reading = streaming.read_float32

    def watched(opened, name):
        if name.endswith("norm.weight"):      # twice a layer and at the end: enough to see
            alive.append(_float32_alive(read))    # every layer's weights alive at once
        tensor = reading(opened, name)
        names.append(name)
        read[tensor.data_ptr()] = (name, tensor.nbytes, tuple(tensor.shape))
        return tensor

    monkeypatch.setattr(streaming, "read_float32", watched)
    model = _streamed(folder)
    assert len(names) == len(set(names)) == 9 * LAYERS + 2       # the tied table once
    kept = {t.data_ptr() for t in (*model.parameters(), *model.buffers())
            if type(t.data) is torch.Tensor}
    dropped = [sum(read[ptr][1] for ptr in ptrs - kept) for ptrs in alive]
    layer = sum(size for name, size, _ in read.values() if name.startswith("model.layers.0."))
    assert max(dropped) <= layer, (max(dropped), layer)
    assert layer > 0 and sum(p.numel() for p in model.parameters()) > 0


def test_a_buffer_transformers_leaves_unset_is_not_used(folder, monkeypatch):
    import transformers as tf

    monkeypatch.setattr(tf.LlamaForCausalLM, "_init_weights", lambda self, module: None)
    with pytest.raises(streaming.NotStreamable, match="rotary_emb.inv_freq unset"):
        _streamed(folder)


def test_a_checkpoint_whose_names_are_not_the_models_is_loaded_whole(folder, tmp_path):
    """load() says why and returns the float32 model (the export quantizes a copy of it)."""
    import json
    from safetensors.torch import load_file, save_file

    from xnnfold.export.hf import parts, plan as hf_plan

    for item in folder.iterdir():
        (tmp_path / item.name).write_bytes(item.read_bytes())
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["model.norm.scale"] = tensors.pop("model.norm.weight")
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "model.safetensors.index.json").unlink(missing_ok=True)
    plan = hf_plan.plan(str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["architectures"]
    model, note = parts.load(plan, "auto", "8da4w")
    assert "loaded whole, then quantized 8da4w" in note and "model.norm" in note, note
    assert not is_quantized(model)
