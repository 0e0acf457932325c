"""The passes over one artifact's events: clock correction, filters, identities, nesting, flow
ids; listed in :mod:`.passes`, fused for the common case in :mod:`.fastpath`."""
