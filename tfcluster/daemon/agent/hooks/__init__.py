"""Per-task features, one hook each (api.py): events, evaluator summaries, checkpoint shipping and copies;
imports tasks, code and the shim, never the session.
"""
