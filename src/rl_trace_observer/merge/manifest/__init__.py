"""The merge manifest (``<output>.manifest.json``): the document and how the run fills it."""
