"""The docs' measured material: every duration the pages quote (``durations``, into
``docs/durations.json``) and the TensorBoard screenshots (``tensorboard_screenshots``, into ``docs/img``)."""
