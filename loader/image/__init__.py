"""The CPU image path: one sample's bytes to a transformed image tensor, as a DataLoader worker makes it.

- :mod:`.decode`: bytes to an RGB ``uint8`` tensor (torchcodec for JPEG, Pillow for the rest), upright.
- :mod:`.scaled`: large JPEGs decoded at the DCT scale their view needs, with the preset's own draws.
- :mod:`.presets`: the named transforms (``"train"``, ``"eval"``...) and the views they draw.

What lives here imports only :mod:`imgshards.loader.errors` and the converter's header readers: no
dataset, pipeline, device or state module, so the workers, the training process's decoder
(:mod:`imgshards.loader.device`) and a user's own pipeline can all import it.
"""
