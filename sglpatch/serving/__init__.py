"""Serving a model: launch profiles (``profiles/``) and the Quark checkpoint hand fix."""
