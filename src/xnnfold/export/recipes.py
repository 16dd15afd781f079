"""executorch's export recipes, lowered through xnnfold.

executorch 1.5.1 exports with recipes: ``executorch.export.export(model, [inputs],
export_recipe=ExportRecipe.get_recipe(XNNPackRecipeType.FP32))``, the recipe coming from the
``BackendRecipeProvider`` registered for its backend in ``executorch.export.recipe_registry``.
XNNPACK's provider builds the stock ``XnnpackPartitioner``; this module registers a provider of
its own under the backend name ``"xnnfold"``, with the same recipe types, quantizers, edge and
ExecuTorch configs, and ``xnnfold.XnnpackPartitioner`` as the one difference::

    from executorch.export import ExportRecipe, export
    from xnnfold.export.recipes import XnnfoldRecipeType

    session = export(model, [inputs], export_recipe=ExportRecipe.get_recipe(XnnfoldRecipeType.FP32))

or ``xnnfold.export.recipes.get_recipe(XNNPackRecipeType.FP32)`` (either type). Importing this module
registers the provider (as importing ``executorch.backends.xnnpack.recipes`` registers
XNNPACK's); executorch's own ``"xnnpack"`` provider is left as it is.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from executorch.backends.xnnpack.recipes.xnnpack_recipe_provider import XNNPACKRecipeProvider
from executorch.backends.xnnpack.recipes.xnnpack_recipe_types import XNNPackRecipeType
from executorch.backends.xnnpack.utils.configs import get_xnnpack_edge_compile_config
from executorch.export import ExportRecipe, LoweringRecipe, RecipeType, recipe_registry

from ..partitioner import XnnpackPartitioner

BACKEND = "xnnfold"


class XnnfoldRecipeType(RecipeType):
    """XNNPACK's recipe types, lowered through xnnfold (backend ``"xnnfold"``)."""

    FP32 = "xnnfold_fp32"
    PT2E_INT8_DYNAMIC_PER_CHANNEL = "xnnfold_pt2e_int8_dynamic_per_channel"
    PT2E_INT8_STATIC_PER_CHANNEL = "xnnfold_pt2e_int8_static_per_channel"
    PT2E_INT8_STATIC_PER_TENSOR = "xnnfold_pt2e_int8_static_per_tensor"
    TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_CHANNEL = "xnnfold_torchao_int8da_int4w_per_channel"
    TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR = "xnnfold_torchao_int8da_int4w_per_tensor"

    @classmethod
    def get_backend_name(cls) -> str:
        return BACKEND

    @property
    def xnnpack(self) -> XNNPackRecipeType:
        """The XNNPACK recipe type this one lowers like."""
        return XNNPackRecipeType[self.name]


class XnnfoldRecipeProvider(XNNPACKRecipeProvider):
    """XNNPACK's recipes with ``xnnfold.XnnpackPartitioner`` in their lowering recipe.

    Everything else (quantizers, torchao configs, the edge compile config, the ExecuTorch
    backend config, the checks of ``group_size``) is XNNPACK's provider's own, inherited. It
    takes :class:`XnnfoldRecipeType` and :class:`XNNPackRecipeType` alike. ``backend_name``
    is ``"xnnfold"``; another name (``"xnnpack"``) makes it serve that backend's recipe types
    in the registry, which is how executorch's own recipe tests run against it
    (``conformance/xnnfold_recipes.py``).
    """

    def __init__(self, backend_name: str = BACKEND):
        self._backend_name = backend_name

    @property
    def backend_name(self) -> str:
        return self._backend_name

    def get_supported_recipes(self) -> Sequence[RecipeType]:
        if self._backend_name == BACKEND:
            return [*XnnfoldRecipeType, *XNNPackRecipeType]
        return list(XNNPackRecipeType)

    def create_recipe(self, recipe_type: RecipeType, **kwargs: Any) -> Optional[ExportRecipe]:
        xnnpack_type = recipe_type.xnnpack if isinstance(recipe_type, XnnfoldRecipeType) \
            else recipe_type
        recipe = super().create_recipe(xnnpack_type, **kwargs)
        if recipe is not None:
            recipe.name = recipe_type.value
        return recipe

    # The one override: XNNPACK's provider builds every lowering recipe here (a private
    # method of 1.5.1's provider; tests/test_recipes.py checks each recipe type's partitioner,
    # so a rename upstream fails there instead of silently lowering with stock).
    def _get_xnnpack_lowering_recipe(self, precision_type=None) -> LoweringRecipe:
        return LoweringRecipe(partitioners=[XnnpackPartitioner(precision_type=precision_type)],
                              edge_compile_config=get_xnnpack_edge_compile_config())


def get_recipe(recipe_type: RecipeType, **kwargs: Any) -> ExportRecipe:
    """The export recipe of ``recipe_type`` (an :class:`XnnfoldRecipeType` or an
    ``XNNPackRecipeType``), lowering through xnnfold."""
    if not isinstance(recipe_type, (XnnfoldRecipeType, XNNPackRecipeType)):
        raise ValueError(f"{recipe_type!r} is not an XNNPACK or xnnfold recipe type")
    recipe = XnnfoldRecipeProvider().create_recipe(recipe_type, **kwargs)
    if recipe is None:
        raise ValueError(f"recipe {recipe_type.value!r} is not supported")
    return recipe


recipe_registry.register_backend_recipe_provider(XnnfoldRecipeProvider())
