"""Where ``rebase`` tries renditions: the candidates of a patch, nearest release first, and the
trial repository -- the release's pristine commit in a scratch clone, each rendition applied with
git plumbing in a private index on top of the patches accepted before it, and judged there."""

from __future__ import annotations

import ast
import dataclasses
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from sglpatch.apply.checkouts import checkout_commit
from sglpatch.apply.index_apply import apply_to_index, check_exact, commit_patch, conflict_detail, display_name, reverse_applies
from sglpatch.plumbing.errors import Unavailable
from sglpatch.plumbing.gitcmd import borrow_objects, git_out, run_git
from sglpatch.rebase import judge as judging
from sglpatch.rebase import merge_tools
from sglpatch.series.diffs import parse_diff
from sglpatch.series.patches import PatchFile, SeriesPatch
from sglpatch.sources import pristine_tree
from sglpatch.sources.pins import Pin
from sglpatch.witnesses import answer_cache, mtp_exclude
from sglpatch.witnesses import probe_runs
from sglpatch.witnesses.results import CLEAN, WitnessResult

IMPORT_SMOKE_LIMIT_S = 300


@dataclass
class Candidate:
    """A rendition to try on the release, with the pins it was made for."""

    rendition: PatchFile
    made_for: Pin | None
    bases: list[Pin]  # every pin the rendition covers, nearest first
    rank: tuple


def candidates(patch: SeriesPatch, pins: tuple[Pin, ...], version: str) -> list[Candidate]:
    """Every rendition of ``patch``, nearest release first: one that claims ``version`` itself,
    then by how many pins lie between ``version`` and the nearest pin the rendition covers (the
    older side first on a tie: a release grows out of the one before it)."""
    ordered = sorted([pin.version for pin in pins] + [version], key=Version)
    at = ordered.index(version)
    found = []
    for rendition in patch.renditions:
        covered = [pin for pin in pins if rendition.covers(pin.version)]
        covered.sort(key=lambda pin: (abs(ordered.index(pin.version) - at), pin.parsed_version > Version(version)))
        stem = next((pin for pin in covered if pin.version == rendition.path.stem), None)
        if rendition.covers(version):
            rank = (0, 0)
        elif covered:
            nearest = covered[0]
            rank = (abs(ordered.index(nearest.version) - at), int(nearest.parsed_version > Version(version)))
        else:
            rank = (len(ordered) + 1, 0)
        found.append(Candidate(rendition, stem or (covered[0] if covered else None), covered, rank))
    return sorted(found, key=lambda candidate: candidate.rank)


class Trial:
    """The release's pristine commit in a scratch clone, where renditions are tried with git
    plumbing in a private index, each patch on top of the ones accepted before it."""

    def __init__(self, scratch: Path, pin: Pin, pristine: pristine_tree.Pristine):
        self.scratch = scratch
        self.pin = pin
        self.pristine = pristine
        self.repo = scratch / "trial"
        run_git(["clone", "--quiet", "--no-checkout", str(pristine.repo), str(self.repo)], scratch)
        self.env = {"GIT_INDEX_FILE": str(scratch / "index")}
        self.parent = pristine.commit
        self._verdicts: dict[str, tuple] = {}
        self.wiggle = merge_tools.wiggle_available()

    def borrow(self, bases: list[pristine_tree.Pristine]) -> None:
        """Borrow the objects of other pristine trees (for merges from the trees renditions were made for)."""
        borrow_objects(self.repo / ".git" / "objects", [base.repo for base in bases])

    def apply_text(self, diff: str) -> merge_tools.Proposal:
        """A diff (a rendition less some hunks) applied exactly on the current parent."""
        self._reset()
        done = run_git(["apply", "--cached", "--whitespace=nowarn", "-"], self.repo, env=self.env, input=diff.encode(), check=False)
        if done.returncode != 0:
            return merge_tools.Proposal(detail=done.stderr.decode(errors="replace").strip()[-800:])
        tree = git_out(["write-tree"], self.repo, env=self.env)
        changed = git_out(["diff", "--name-only", "--no-renames", self.parent, tree], self.repo).splitlines()
        return merge_tools.Proposal(tree, changed)

    def commit_tree(self, rendition: PatchFile, tree: str) -> str:
        return commit_patch(self.repo, rendition, tree, self.parent)

    def _exists(self, commit: str, path: str) -> bool:
        return run_git(["cat-file", "-e", f"{commit}:{path}"], self.repo, check=False).returncode == 0

    def _text(self, commit: str, path: str) -> str | None:
        shown = run_git(["cat-file", "blob", f"{commit}:{path}"], self.repo, check=False)
        return shown.stdout.decode(errors="replace") if shown.returncode == 0 else None

    def judge(self, witness, commit: str) -> tuple[judging.Verdict, WitnessResult | None]:
        """The judge's verdict on ``commit`` (a candidate on the current parent): names, then the
        witness, then the import smoke, each only when the ones before passed. ``witness`` may be
        a list (the patch's witness, then its regression tests: ``registry.witnesses_for``):
        every one must pass on the port; the answer given back is the first's."""
        witnesses = list(witness) if isinstance(witness, (list, tuple)) else [witness]
        tree = git_out(["rev-parse", f"{commit}^{{tree}}"], self.repo)
        key = (tree, self.parent, ",".join(w.name for w in witnesses))
        if key in self._verdicts:
            return self._verdicts[key]
        verdict = judging.Verdict()
        changed = [p for p in git_out(["diff", "--name-only", "--no-renames", self.parent, commit], self.repo).splitlines() if p]
        # Names are checked against the release's own tree (with the patches accepted before this
        # one); what only the candidate defines is the port's own addition, and said so.
        port = judging.Release(lambda path: self._text(commit, path), lambda path: self._exists(commit, path))
        release = judging.Release(lambda path: self._text(self.parent, path), lambda path: self._exists(self.parent, path),
                                  port=port)
        for path in changed:
            new = self._text(commit, path)
            if path.endswith(".py") and new is not None:
                verdict.names += judging.names_findings(path, self._text(self.parent, path), new, release)
        verdict.added = list(dict.fromkeys(release.added))
        verdict.checked.append("names")
        after = None
        if not verdict.names:
            answers = self.witnesses(witnesses, commit)
            after = answers[witnesses[0].name]
            verdict.checked.append("witness")
            for checked in witnesses:
                answer = answers[checked.name]
                if answer.state != CLEAN:
                    verdict.witness.append(f"{checked.name} says {answer.summary()} on the port: {answer.detail}"[:600])
            if not verdict.witness:
                verdict.imports = self.import_smoke(commit, changed)
                verdict.checked.append("imports")
        self._verdicts[key] = (verdict, after)
        return verdict, after

    def import_smoke(self, commit: str, changed: list[str]) -> list[str]:
        """Findings of importing every module the port touches (and, for a kernel source, the
        modules that load it) in the pin's CPU Python on the emulated MI355X box."""
        modules, blind = [], []
        for path in changed:
            if path.startswith("python/sglang/") and path.endswith(".py"):
                before = self._text(self.parent, path)
                try:
                    ast.parse(before or "")
                except SyntaxError as exc:
                    blind.append(f"could not check {path}: the release's own file does not parse here (line {exc.lineno}: {exc.msg})")
                    continue
                modules.append(path[len("python/"):-3].replace("/", ".").removesuffix(".__init__"))
            elif path.startswith("python/sglang/"):
                name = Path(path).name
                found = run_git(["grep", "-l", "-F", name, commit, "--", "python/sglang/*.py"], self.repo, check=False)
                loaders = found.stdout.decode().splitlines()
                if not loaders:
                    blind.append(f"could not check {path}: no module of the release names {name}, so none loads it")
                for line in loaders:
                    module = line.split(":", 1)[-1]
                    modules.append(module[len("python/"):-3].replace("/", ".").removesuffix(".__init__"))
            else:
                blind.append(f"could not check {path}: it is outside the package (python/sglang/), nothing imports it")
        modules = list(dict.fromkeys(modules))
        if not modules:
            return blind or ["could not check: the port touches no module to import"]
        try:
            python = probe_runs.cpu_python(self.pin)
        except Unavailable as exc:
            return [f"unavailable: no CPU Python for {self.pin.version}: {exc}"[:600]]
        environment = mtp_exclude.probe_request(self.pin).environment()
        request = probe_runs.ProbeRequest("import-smoke", "import_smoke", {"modules": modules}, IMPORT_SMOKE_LIMIT_S,
                                     import_env=environment[0], arch=environment[1])
        tree = checkout_commit(self.repo, commit, Path(tempfile.mkdtemp(dir=self.scratch, prefix="imports-")))
        run = python.run_probes(tree, [dataclasses.replace(request)], remember=True)
        shutil.rmtree(tree, ignore_errors=True)
        failure = run.failure(request.name)
        if failure:
            return [f"unavailable: {failure}"[:600]]
        answer = run.answers[request.name].get("modules", {})
        return blind + [f"{module}: {error}"[:600] for module, error in answer.items() if error]

    def _reset(self) -> None:
        run_git(["read-tree", self.parent], self.repo, env=self.env)

    def _commit(self, rendition: PatchFile) -> str:
        tree = git_out(["write-tree"], self.repo, env=self.env)
        return commit_patch(self.repo, rendition, tree, self.parent)

    def exact(self, rendition: PatchFile) -> tuple[str, str, str]:
        """(result, commit or "", detail) of applying the rendition as it is."""
        self._reset()
        exact = check_exact(self.repo, self.env, rendition.diff_text)
        if not exact.applies:
            return "does not apply", "", conflict_detail(display_name(rendition), parse_diff(rendition), exact.stderr)
        tree = apply_to_index(self.repo, self.env, rendition.diff_text)
        return ("applies-with-offset" if exact.offsets else "applies"), self.commit_tree(rendition, tree), exact.offsets

    def reverse_applies(self, rendition: PatchFile) -> bool:
        self._reset()
        return reverse_applies(self.repo, self.env, rendition.diff_text)

    def three_way(self, rendition: PatchFile, bases: list[pristine_tree.Pristine]) -> tuple[str, str, str]:
        """(result, commit or "", detail) of a three-way merge from the trees the rendition was
        made for (their objects are borrowed, not copied)."""
        self.borrow(bases)
        self._reset()
        merged = run_git(["apply", "--cached", "--3way", "--whitespace=nowarn", "-"], self.repo, env=self.env, input=rendition.diff_text.encode(), check=False)
        if merged.returncode != 0:
            message = merged.stderr.decode().strip()
            return "conflict", "", message[-1500:]
        return "merges", self._commit(rendition), ""

    def witness(self, witness, commit: str) -> WitnessResult:
        tree = git_out(["rev-parse", f"{commit}^{{tree}}"], self.repo)

        def materialize() -> Path:
            return checkout_commit(self.repo, commit, Path(tempfile.mkdtemp(dir=self.scratch, prefix="witness-")))

        return answer_cache.run_cached(witness, tree, self.pin, materialize)

    def witnesses(self, witnesses: list, commit: str) -> dict[str, WitnessResult]:
        """Every witness's answer on ``commit``, the CPU probes among them in one go."""
        tree = git_out(["rev-parse", f"{commit}^{{tree}}"], self.repo)

        def materialize() -> Path:
            return checkout_commit(self.repo, commit, Path(tempfile.mkdtemp(dir=self.scratch, prefix="witness-")))

        return answer_cache.run_cached_many(witnesses, tree, self.pin, materialize)

    def format_patch(self, commit: str) -> str:
        return run_git(["format-patch", "-1", "--stdout", "--zero-commit", commit], self.repo).stdout.decode()
