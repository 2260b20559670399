"""TE's `transformer_engine.pytorch.quantization` (SPEC §14): autocast (alias fp8_autocast),
quantized_model_init (alias fp8_model_init), the recipes, and the recipe state's helpers. The
code lives in tpflex._quant (the layers import it below this package); docs there."""
from ..common.recipe import (CustomRecipe, DelayedScaling, Float8BlockScaling,
                             Float8CurrentScaling, Format, MMParams, MXFP8BlockScaling,
                             NVFP4BlockScaling, QParams, Recipe)
from .._quant import (autocast, check_recipe_support, fp8_autocast, fp8_model_init,
                      get_default_fp8_recipe, get_fp8_recipe, is_fp8_enabled,
                      quantized_model_init)

__all__ = ["autocast", "fp8_autocast", "quantized_model_init", "fp8_model_init",
           "is_fp8_enabled", "get_fp8_recipe", "get_default_fp8_recipe", "check_recipe_support",
           "Recipe", "Format", "MMParams", "QParams", "DelayedScaling", "Float8CurrentScaling",
           "MXFP8BlockScaling", "Float8BlockScaling", "NVFP4BlockScaling", "CustomRecipe"]
