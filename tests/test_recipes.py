"""executorch's export recipes through xnnfold (``xnnfold.export.recipes``): the recipe API lowers
with xnnfold's partitioner, and on ``nn.TransformerDecoderLayer`` leaves no GEMM outside
delegates where XNNPACK's FP32 recipe leaves two."""

import pytest
import torch
from executorch.backends.xnnpack.recipes import XNNPackRecipeType
from executorch.export import ExportRecipe, export, recipe_registry

import xnnfold
from xnnfold.pte import inspect_lowered, run_pte
from xnnfold.export.recipes import XnnfoldRecipeProvider, XnnfoldRecipeType, get_recipe


def test_every_recipe_type_lowers_with_xnnfold():
    for recipe_type in [*XnnfoldRecipeType, *XNNPackRecipeType]:
        recipe = get_recipe(recipe_type)
        stock = XNNPackRecipeType[recipe_type.name]
        (partitioner,) = recipe.lowering_recipe.partitioners
        assert type(partitioner) is xnnfold.XnnpackPartitioner, recipe_type
        assert recipe.name == recipe_type.value
        # the rest is XNNPACK's own recipe's: the same quantizers and configs
        reference = ExportRecipe.get_recipe(stock)
        assert type(recipe.quantization_recipe) is type(reference.quantization_recipe)
        assert recipe.executorch_backend_config == reference.executorch_backend_config


def test_registry_serves_xnnfold_beside_xnnpack():
    assert {"xnnfold", "xnnpack"} <= set(recipe_registry.list_backends())
    recipe = ExportRecipe.get_recipe(XnnfoldRecipeType.PT2E_INT8_DYNAMIC_PER_CHANNEL)
    assert type(recipe.lowering_recipe.partitioners[0]) is xnnfold.XnnpackPartitioner
    stock = ExportRecipe.get_recipe(XNNPackRecipeType.FP32)   # executorch's own: untouched
    assert type(stock.lowering_recipe.partitioners[0]) is not xnnfold.XnnpackPartitioner
    as_xnnpack = XnnfoldRecipeProvider("xnnpack")
    assert as_xnnpack.backend_name == "xnnpack"
    assert as_xnnpack.get_supported_recipes() == list(XNNPackRecipeType)
    with pytest.raises(ValueError, match="must be an integer"):
        get_recipe(XnnfoldRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR,
                   group_size="32")
    with pytest.raises(ValueError, match="not an XNNPACK or xnnfold recipe type"):
        get_recipe("xnnpack_fp32")


@pytest.fixture(scope="module")
def decoder_layer():
    torch.manual_seed(0)
    layer = torch.nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()
    for attn in (layer.self_attn, layer.multihead_attn):
        torch.nn.init.normal_(attn.in_proj_bias)
    return layer, (torch.randn(1, 5, 16), torch.randn(1, 7, 16))


@pytest.mark.parametrize("recipe_type, gemms_outside", [
    (XNNPackRecipeType.FP32, 2), (XnnfoldRecipeType.FP32, 0)])
def test_fp32_recipe_on_a_decoder_layer(decoder_layer, recipe_type, gemms_outside):
    layer, inputs = decoder_layer
    session = export(layer, [inputs], export_recipe=ExportRecipe.get_recipe(recipe_type))
    # the session's edge program has gone through to_executorch: out variants
    ops, _, _, _ = inspect_lowered(session.get_edge_program_manager().exported_program())
    gemms = [op for op in ops if op.rsplit(".", 1)[0] in (
        "aten.linear", "aten.addmm", "aten.mm", "aten.bmm", "aten.convolution")]
    assert len(gemms) == gemms_outside, ops
    with torch.no_grad():
        expected = layer(*inputs)
    (output,) = run_pte(session.get_pte_buffer(), inputs)
    torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-5)
