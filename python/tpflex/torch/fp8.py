"""TE's deprecated `transformer_engine.pytorch.fp8` path: the recipes and fp8_autocast."""
from .quantization import (CustomRecipe, DelayedScaling, Float8BlockScaling,  # noqa: F401
                           Float8CurrentScaling, Format, MXFP8BlockScaling, NVFP4BlockScaling,
                           Recipe, check_recipe_support, fp8_autocast, fp8_model_init,
                           get_default_fp8_recipe)
