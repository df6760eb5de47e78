"""The hook repositories sglang's ``.pre-commit-config.yaml`` names, as pre-commit needs them
without reaching GitHub: each one's hook definitions (its ``.pre-commit-hooks.yaml``) and the
package on the package index that carries its tools at the version its tags name.

pre-commit installs a hook repository by cloning it from GitHub; this machine reaches only the
package index. Every repository below is a Python package released on the index under the same
version as its git tag (``rev: v5.0.0`` is ``pre-commit-hooks==5.0.0``; ``mirrors-clang-format``
and ``ruff-pre-commit`` are mirrors whose only content is that requirement), so a local git
repository holding the manifest and that one requirement is the same hook at the same version:
``upstream_precommit`` makes one per repository and rev and points the clone's config at it,
every hook id, argument and rev as the config states them.

Where the definitions were read (facts, not code): ``black``'s from its 24.10.0 sdist on the
index; the others from the repositories' ``.pre-commit-hooks.yaml`` at the commits named in
``source`` (the stored copies within reach here, not necessarily at the config's rev; the hooks
sglang uses are defined alike in every version listed). A repository not listed, or one whose
hooks need another toolchain (``language: rust``), cannot be had here: its hooks are said so.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HookRepo:
    url: str
    package: str | None  # the index's package at the rev's version; None: not installable from the index
    source: str  # where the hook definitions were read
    hooks: tuple[dict, ...]
    why_not: str = ""  # for a repository that cannot be had: why


def _python(hook_id: str, name: str, entry: str, **more) -> dict:
    return {"id": hook_id, "name": name, "entry": entry, "language": "python", **more}


_PRE_COMMIT_HOOKS = tuple(
    _python(hook_id, name, entry, **more) for hook_id, name, entry, more in (
        ("check-added-large-files", "check for added large files", "check-added-large-files",
         {"stages": ["pre-commit", "pre-push", "manual"], "minimum_pre_commit_version": "3.2.0"}),
        ("check-ast", "check python ast", "check-ast", {"types": ["python"]}),
        ("check-builtin-literals", "check builtin type constructor use", "check-builtin-literals", {"types": ["python"]}),
        ("check-case-conflict", "check for case conflicts", "check-case-conflict", {}),
        ("check-docstring-first", "check docstring is first", "check-docstring-first", {"types": ["python"]}),
        ("check-executables-have-shebangs", "check that executables have shebangs", "check-executables-have-shebangs",
         {"types": ["text", "executable"], "stages": ["pre-commit", "pre-push", "manual"],
          "minimum_pre_commit_version": "3.2.0"}),
        ("check-json", "check json", "check-json", {"types": ["json"]}),
        ("check-shebang-scripts-are-executable", "check that scripts with shebangs are executable",
         "check-shebang-scripts-are-executable",
         {"types": ["text"], "stages": ["pre-commit", "pre-push", "manual"], "minimum_pre_commit_version": "3.2.0"}),
        ("pretty-format-json", "pretty format json", "pretty-format-json", {"types": ["json"]}),
        ("check-merge-conflict", "check for merge conflicts", "check-merge-conflict", {"types": ["text"]}),
        ("check-symlinks", "check for broken symlinks", "check-symlinks", {"types": ["symlink"]}),
        ("check-toml", "check toml", "check-toml", {"types": ["toml"]}),
        ("check-vcs-permalinks", "check vcs permalinks", "check-vcs-permalinks", {"types": ["text"]}),
        ("check-xml", "check xml", "check-xml", {"types": ["xml"]}),
        ("check-yaml", "check yaml", "check-yaml", {"types": ["yaml"]}),
        ("debug-statements", "debug statements (python)", "debug-statement-hook", {"types": ["python"]}),
        ("destroyed-symlinks", "detect destroyed symlinks", "destroyed-symlinks",
         {"types": ["file"], "stages": ["pre-commit", "pre-push", "manual"]}),
        ("detect-aws-credentials", "detect aws credentials", "detect-aws-credentials", {"types": ["text"]}),
        ("detect-private-key", "detect private key", "detect-private-key", {"types": ["text"]}),
        ("double-quote-string-fixer", "fix double quoted strings", "double-quote-string-fixer", {"types": ["python"]}),
        ("end-of-file-fixer", "fix end of files", "end-of-file-fixer",
         {"types": ["text"], "stages": ["pre-commit", "pre-push", "manual"], "minimum_pre_commit_version": "3.2.0"}),
        ("file-contents-sorter", "file contents sorter", "file-contents-sorter", {"files": "^$"}),
        ("fix-byte-order-marker", "fix utf-8 byte order marker", "fix-byte-order-marker", {"types": ["text"]}),
        ("forbid-new-submodules", "forbid new submodules", "forbid-new-submodules", {"types": ["directory"]}),
        ("mixed-line-ending", "mixed line ending", "mixed-line-ending", {"types": ["text"]}),
        ("name-tests-test", "python tests naming", "name-tests-test", {"files": r"(^|/)tests/.+\.py$"}),
        ("no-commit-to-branch", "don't commit to branch", "no-commit-to-branch",
         {"pass_filenames": False, "always_run": True}),
        ("requirements-txt-fixer", "fix requirements.txt", "requirements-txt-fixer",
         {"files": r"(requirements|constraints).*\.txt$"}),
        ("sort-simple-yaml", "sort simple yaml files", "sort-simple-yaml", {"files": "^$"}),
        ("trailing-whitespace", "trim trailing whitespace", "trailing-whitespace-fixer",
         {"types": ["text"], "stages": ["pre-commit", "pre-push", "manual"], "minimum_pre_commit_version": "3.2.0"}),
    )
)

HOOK_REPOS = (
    HookRepo("https://github.com/pre-commit/pre-commit-hooks", "pre-commit-hooks",
             "pre-commit/pre-commit-hooks .pre-commit-hooks.yaml at f47ab2f43c2b", _PRE_COMMIT_HOOKS),
    HookRepo("https://github.com/PyCQA/isort", "isort",
             "PyCQA/isort .pre-commit-hooks.yaml (its stages line since 5.13.2, #2213)",
             (_python("isort", "isort", "isort", stages=["pre-commit", "pre-merge-commit", "pre-push", "manual"],
                      require_serial=True, types_or=["cython", "pyi", "python"], args=["--filter-files"],
                      minimum_pre_commit_version="3.2.0"),)),
    HookRepo("https://github.com/astral-sh/ruff-pre-commit", "ruff",
             "astral-sh/ruff-pre-commit .pre-commit-hooks.yaml at ba4269e9c682",
             (_python("ruff", "ruff", "ruff check --force-exclude", types_or=["python", "pyi"], args=[],
                      require_serial=True, additional_dependencies=[], minimum_pre_commit_version="2.9.2"),
              _python("ruff-format", "ruff-format", "ruff format --force-exclude", types_or=["python", "pyi"], args=[],
                      require_serial=True, additional_dependencies=[], minimum_pre_commit_version="2.9.2"))),
    HookRepo("https://github.com/psf/black", "black", "black 24.10.0 sdist .pre-commit-hooks.yaml",
             (_python("black", "black", "black", minimum_pre_commit_version="2.9.2", require_serial=True,
                      types_or=["python", "pyi"]),
              _python("black-jupyter", "black-jupyter", "black", minimum_pre_commit_version="2.9.2", require_serial=True,
                      types_or=["python", "pyi", "jupyter"], additional_dependencies=[".[jupyter]"]))),
    HookRepo("https://github.com/codespell-project/codespell", "codespell",
             "codespell-project/codespell .pre-commit-hooks.yaml at 1b6e02b6f06d",
             (_python("codespell", "codespell", "codespell", types=["text"], args=[], require_serial=False,
                      additional_dependencies=[]),)),
    HookRepo("https://github.com/pre-commit/mirrors-clang-format", "clang-format",
             "pre-commit/mirrors-clang-format .pre-commit-hooks.yaml at 579d9fe3b1ee",
             (_python("clang-format", "clang-format", "clang-format -i",
                      types_or=["c++", "c", "c#", "cuda", "java", "javascript", "json", "objective-c", "proto",
                                "textproto"],
                      args=["-style=file"], require_serial=False, additional_dependencies=[],
                      minimum_pre_commit_version="2.9.2"),)),
    HookRepo("https://github.com/kynan/nbstripout", "nbstripout", "kynan/nbstripout .pre-commit-hooks.yaml at 7c6fa6edb46c",
             (_python("nbstripout", "nbstripout", "nbstripout", files=r"\.ipynb$"),)),
    HookRepo("https://github.com/doublify/pre-commit-rust", None, "doublify/pre-commit-rust .pre-commit-hooks.yaml at 1c787730fac3",
             ({"id": "fmt", "name": "fmt", "entry": "cargo fmt", "language": "rust", "types": ["rust"], "args": ["--"]},
              {"id": "cargo-check", "name": "cargo check", "entry": "cargo check", "language": "rust", "types": ["rust"],
               "pass_filenames": False},
              {"id": "clippy", "name": "clippy", "entry": "cargo clippy", "language": "rust",
               "args": ["--", "-D", "warnings"], "types": ["rust"], "pass_filenames": False}),
             why_not="language rust: its toolchain is not on the package index"),
)


def normalized(url: str) -> str:
    """A repository URL as the table keys it: https, lower case, no ``.git`` or trailing slash."""
    url = url.strip().rstrip("/").removesuffix(".git").lower()
    return "https://" + url.split("://", 1)[1] if "://" in url else url


_BY_URL = {normalized(repo.url): repo for repo in HOOK_REPOS}


def hook_repo(url: str) -> HookRepo | None:
    return _BY_URL.get(normalized(url))
