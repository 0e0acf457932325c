"""From input files to a merge plan: what each file is, which process owns it, what to merge."""
