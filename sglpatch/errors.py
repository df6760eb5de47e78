"""One exception type for every refusal the tool makes, so the CLI prints it plainly."""


class SglpatchError(Exception):
    """A refusal with a message that names the file, patch, hunk or pin at fault."""
