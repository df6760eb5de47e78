"""Our patches: the series and its files, the diffs' checks, the lock, authoring, export, versions."""
