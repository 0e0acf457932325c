"""The one timeline model every stage speaks: events, identities of processes and threads, problems.

Lowest in the merger: imported by every stage, importing none of them.
"""
