"""A run made by the real tools, plus TokenSpeed/Proton files from a format-faithful generator."""
