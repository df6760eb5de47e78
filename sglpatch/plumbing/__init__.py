"""What every room uses: child processes, git, the cache, workers, progress, errors, the project's layout."""
