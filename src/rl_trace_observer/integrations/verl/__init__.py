"""VERL integration. Loaded in every VERL process by ``VERL_USE_EXTERNAL_MODULES`` or the
``verl.plugins`` entry point, both of which import :mod:`.register`."""
