"""The RMS at init of each family's token signal: the scales of the embedding convention (``models.embedding``).

Token tables are drawn at ``EMBEDDING_STD`` (``models.block.init_weights``), the ViT's patch
projection and CLS token at ``PATCH_RMS`` (``models.vit``), and every additive position table at
the RMS of the signal it is added to (``models.position``). A leaf module, so that those modules
share the constants without importing each other.
"""

#: std at init of token tables (GPT-2's 0.02), hence the RMS of their position tables
EMBEDDING_STD = 0.02
#: RMS at init of the ViT's patch projection on unit-variance pixels, hence of its position table
PATCH_RMS = 2**-0.5
