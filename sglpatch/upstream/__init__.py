"""Back upstream: pull requests (``upstream_pr`` and its body, split, hooks), status suggestions, the release watch."""
