"""The model store and the builtin models' recipes.

``models.store`` loads, saves and caches models and tokenizers and resolves ``model.path``; a
builtin name is found through ``common.registry.MODELS``, whose entries are the recipes here
(``models.tiny``: the tiny random Qwen models and their ``-arith`` warm start; ``models.smollm``:
SmolLM2 and its format-taught chain variants; ``models.slip_chains``: the chain models with a
planted weakness, the demo's and the study's; ``models.warmstart``: the SFT they share). Recipes
import the store, never the other way.
"""
