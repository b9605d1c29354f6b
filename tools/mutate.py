#!/usr/bin/env python
"""Mutation sweep: break one rule of ranks at a time and check the tests notice.

Each mutation in ``MUTATIONS`` is a named, deliberate rule break: exact source
snippets to find in ``rankcore/`` and what to put instead. The tool
snapshots the working tree once (tracked files and untracked, non-ignored
ones, uncommitted edits included; or a commit, with ``--rev``), and for each
mutation copies that snapshot to a temporary directory, applies the patch, and
runs the fast suite there (``tests/unit tests/property``) with this repo's
interpreter and ``PYTHONPATH`` pointing at the copy, so the mutated
``rankcore`` is the one imported, not the editable install (a tiny pytest
plugin checks that inside the very process that runs the tests).

* KILLED: the suite failed (good: the rule is guarded);
* SURVIVED: the suite passed (a rule can break without any test noticing);
* TIMEOUT: the suite did not finish in time (counted as killed, shown apart);
* ERROR: the mutation could not be tested (its snippet is not in the code
  exactly once, the copy's imports went elsewhere, pytest refused the arguments).

Exit status: 0 when every mutation was killed, 1 when any survived, 2 on an
error (a snippet that no longer matches is an error: keep this list in sync
with the code). An unmutated copy is run first (the baseline); if it fails,
nothing else runs.

Run it before a release (it takes minutes, so it is not part of ``make test``):

    .venv/bin/python tools/mutate.py                 # the whole sweep
    .venv/bin/python tools/mutate.py --list          # what each mutation breaks
    .venv/bin/python tools/mutate.py --check         # only: does every snippet still match once?
    .venv/bin/python tools/mutate.py --only node-loss-reverse-order --jobs 2

See docs/mutation-testing.md.
"""

from __future__ import annotations

import io
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PYTEST_ARGS = "-x -q -p no:cacheprovider tests/unit tests/property"
#: pytest exit status the probe plugin uses when the copy's rankcore was not the one imported
PROBE_RC = 97
PROBE_MODULE = "_rankcore_mutate_probe"
ENV_VAR = "RANKCORE_MUTATION"

KILLED, SURVIVED, TIMEOUT, ERROR = "killed", "survived", "timeout", "error"


class MutationError(Exception):
    """A mutation cannot be applied (its snippet is missing or ambiguous), or the setup is wrong."""


@dataclass(frozen=True)
class Edit:
    """Replace ``find`` (which must occur exactly once in ``file``) by ``replace``."""

    file: str
    find: str
    replace: str


@dataclass(frozen=True)
class Mutation:
    name: str
    breaks: str  # the rule this mutation breaks, in one line
    edits: tuple[Edit, ...]

    @property
    def files(self) -> list[str]:
        return sorted({e.file for e in self.edits})


def mutation(name: str, file: str, find: str, replace: str, breaks: str,
             more: Sequence[Edit] = ()) -> Mutation:
    """One mutation: an edit of ``file`` (plus ``more`` edits when one rule lives in several places)."""
    return Mutation(name=name, breaks=breaks, edits=(Edit(file, find, replace), *more))


CORE, RECOVERY, RANKS = "rankcore/core.py", "rankcore/recovery.py", "rankcore/ranks.py"
TX, POLICIES = "rankcore/transaction.py", "rankcore/policies.py"
#: the fast paths repeat the plainest case of some rules: a mutant of such a
#: rule edits both copies, so it is killed by the rule's tests, not only by
#: the fast-path equivalence test
FAST = "rankcore/fastpaths.py"

# Snippets are exact text (indentation included); each must occur once in its file.
MUTATIONS: tuple[Mutation, ...] = (
    # ------------------------------------------------------------- the four of issue 8 point 12
    mutation(
        "node-loss-reverse-order", CORE,
        "        for rep in by_rank(dep, on_node):\n",
        "        for rep in reversed(by_rank(dep, on_node)):\n",
        "a lost node's replicas are replaced in rank order (lowest rank first), so ids follow ranks",
    ),
    mutation(
        "recovery-node-rank-minority", RECOVERY,
        "min(votes, key=lambda nr: (-votes[nr], nr))",
        "min(votes, key=lambda nr: (votes[nr], nr))",
        "at recovery a node keeps the node rank most of its replicas report (majority vote)",
    ),
    mutation(
        "assign-highest-free-rank", RANKS,
        "        ranks = list(islice(_bits_iter_free(d[_GBITS]), min(holes, k))) if holes else []\n",
        "        ranks = list(islice(_bits_iter_free(d[_GBITS]), holes))[::-1][:k] if holes else []\n",
        "new replicas get the lowest free global rank (here: the highest hole first)",
    ),
    mutation(
        "compact-when-unhealthy", TX,
        "if dep is not None and dep.healthy and not dep.ranks.is_contiguous():",
        "if dep is not None and not dep.ranks.is_contiguous():",
        "ranks are compacted only once the deployment is healthy",
    ),
    # ------------------------------------------------------------------------ core rules
    mutation(
        "crash-replacement-fresh-rank", TX,
        "    ranks = dep.ranks.replace(rid, new_id, node_id) if node_id is not None else dep.ranks.replace(rid, new_id)\n",
        "    ranks = dep.ranks.release(rid).assign(new_id, node_id, rank=dep.ranks.lowest_free())\n",
        "a crashed replica's replacement inherits its global rank",
        more=(
            Edit(FAST,
                 "    ranks = dep.ranks.replace(rid, new_id, node_id)\n",
                 "    ranks = dep.ranks.release(rid).assign(new_id, node_id, rank=dep.ranks.lowest_free())\n"),
        ),
    ),
    mutation(
        "scale-world-size-not-announced", CORE,
        "        dep = _evolve(dep, target=e.num_replicas)\n"
        "        tx.emit(UpdateWorldSize(deployment=dep.name, world_size=dep.target))\n"
        "    tx.put(reconcile(tx, dep, e.victims))\n",
        "        dep = _evolve(dep, target=e.num_replicas)\n"
        "    tx.put(reconcile(tx, dep, e.victims))\n",
        "world_size is announced (UpdateWorldSize) the moment a ScaleRequested changes the target",
    ),
    mutation(
        "victims-lowest-rank-first", TX,
        "(VICTIM_ORDER[r.phase], -ranks.global_rank(r.replica_id), r.replica_id)",
        "(VICTIM_ORDER[r.phase], ranks.global_rank(r.replica_id), r.replica_id)",
        "downscale victims chosen by the core are the highest ranks (so fewer ranks move later)",
    ),
    mutation(
        "victims-running-before-pending", POLICIES,
        "VICTIM_ORDER = {Phase.PENDING: 0, Phase.STARTING: 1, Phase.RUNNING: 2, Phase.RECONFIGURING: 2, Phase.FAILED: -1}",
        "VICTIM_ORDER = {Phase.PENDING: 2, Phase.STARTING: 1, Phase.RUNNING: 0, Phase.RECONFIGURING: 0, Phase.FAILED: -1}",
        "downscale stops not-yet-running replicas before running ones",
    ),
    mutation(
        "stale-reconfigure-ack-as-fresh", CORE,
        "    if e.version < rep.version or rep.phase is Phase.RUNNING:\n",
        "    if rep.phase is Phase.RUNNING:\n",
        "an answer to an older reconfigure is stale: the replica stays reconfiguring until the latest is acked",
    ),
    mutation(
        "release-rank-at-stop-command", TX,
        "        replicas = replicas.set(rid, new)\n"
        "        counts = recount(counts, rep.phase, new.phase)\n"
        "        tx.emit(_Stop(replica_id=rid, deployment=dep.name))\n",
        "        replicas = replicas.set(rid, new)\n"
        "        counts = recount(counts, rep.phase, new.phase)\n"
        "        tx.emit(_Stop(replica_id=rid, deployment=dep.name))\n"
        "        dep = _evolve(dep, ranks=dep.ranks.release(rid))\n",
        "ranks are released only on ReplicaStopped, not when StopReplica is sent",
        more=(
            Edit(CORE,
                 "    tx.put(remove(tx, dep, rep, dep.ranks.release(rep.replica_id)))\n",
                 "    tx.put(remove(tx, dep, rep, dep.ranks))\n"),
            Edit(TX,
                 "        return remove(tx, dep, rep, dep.ranks.release(rid))\n",
                 "        return remove(tx, dep, rep, dep.ranks)\n"),
            Edit(FAST, "    ranks = dep.ranks.release(rid)\n", "    ranks = dep.ranks\n"),
        ),
    ),
    mutation(
        "compaction-without-reconfigure", TX,
        '        new, cmd = reconfigure(dep, rep, "rank")\n'
        "        replicas = replicas.set(new.replica_id, new)\n"
        "        counts = recount(counts, rep.phase, new.phase)\n"
        "        tx.emit(cmd)\n",
        '        new, cmd = reconfigure(dep, rep, "rank")\n'
        "        replicas = replicas.set(new.replica_id, new)\n"
        "        counts = recount(counts, rep.phase, new.phase)\n",
        "every replica whose rank a compaction changed gets a ReconfigureReplica carrying it",
    ),
    # --------------------------------------------------------------------- rank table
    mutation(
        "compaction-highest-mover-lowest-hole", RANKS,
        "new_rank = {owner[old]: new for old, new in zip(movers, holes)}",
        "new_rank = {owner[old]: new for old, new in zip(movers, reversed(holes))}",
        "compaction moves the lowest old rank into the lowest hole",
    ),
    mutation(
        "new-local-rank-above-highest", RANKS,
        "    return _lowest_zero(mask)\n\n\ndef _top(",
        "    return mask.bit_length()\n\n\ndef _top(",
        "a replica placed on a node gets the lowest free local rank there (not one above the highest)",
    ),
    # ----------------------------------------------------------------------- recovery
    mutation(
        "recovery-ignores-local-ranks", RECOVERY,
        "r.replica_id, r.rank.local_rank) for r in rs), MAX_LOCAL)",
        "r.replica_id, None) for r in rs), MAX_LOCAL)",
        "recovery keeps the local ranks replicas report",
    ),
    mutation(
        "recovery-leaving-claim-wins", RECOVERY,
        "(((_leaving(r), r.replica_id), r.replica_id, r.rank.rank) for r in reports), MAX_RANKS",
        "(((not _leaving(r), r.replica_id), r.replica_id, r.rank.rank) for r in reports), MAX_RANKS",
        "at recovery a global rank claimed twice goes to the serving replica, not the stopping one",
    ),
    mutation(
        "recovery-rank-update-dropped", RECOVERY,
        "rep = attrs.evolve(rep, rank_update_due=True)",
        "rep = attrs.evolve(rep, rank_update_due=False)",
        "a recovered, still-starting replica whose rank changed is told its new rank once ready",
    ),
    mutation(
        "recovery-world-size-not-announced", RECOVERY,
        "    if any(r.world_size is not None and r.world_size != spec.num_replicas for r in reports):\n",
        "    if False:\n",
        "recovery announces world_size when a replica reports a different one",
    ),
)


# ------------------------------------------------------------------ mechanics
def repo_files(root: Path) -> list[str]:
    """The working tree's files as git sees them: tracked (as they are now, uncommitted
    edits included; deleted ones skipped) plus untracked ones that are not ignored."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, check=True, capture_output=True,
    ).stdout.decode()
    files = sorted({p for p in out.split("\0") if p})
    return [p for p in files if (root / p).is_file() and not (root / p).is_symlink()]


def copy_tree(root: Path, dest: Path, files: Iterable[str]) -> None:
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)


def snapshot(root: Path, dest: Path, rev: str | None = None) -> list[str]:
    """Copy the code under test to ``dest`` once, so every mutant of a sweep sees the
    same files even while people keep editing: the working tree (``rev`` None) or
    the commit ``rev``. Returns the files copied."""
    if rev is None:
        files = repo_files(root)
        copy_tree(root, dest, files)
        return files
    listing = subprocess.run(["git", "ls-tree", "-r", "-z", "--name-only", rev], cwd=root,
                             capture_output=True)
    if listing.returncode:
        raise MutationError(f"git ls-tree {rev}: {listing.stderr.decode().strip()}")
    archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=root, check=True,
                             capture_output=True).stdout
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # pragma: no cover - Pythons without extraction filters
            tar.extractall(dest)
    names = [p for p in listing.stdout.decode().split("\0") if p]
    return sorted(p for p in names if (dest / p).is_file() and not (dest / p).is_symlink())


def _check_edit(m: Mutation, e: Edit, text: str) -> None:
    n = text.count(e.find)
    if n != 1:
        where = "not found" if n == 0 else f"found {n} times"
        raise MutationError(
            f"mutation {m.name!r}: snippet {where} in {e.file} (it must occur exactly once; "
            f"update tools/mutate.py to match the code):\n{textwrap.indent(e.find, '    | ')}"
        )


def check_mutation(m: Mutation, tree: Path) -> None:
    """Raise MutationError unless every edit of ``m`` matches exactly once in ``tree``
    (edits of one file are checked in order, each on the text the previous ones left)."""
    texts: dict[str, str] = {}
    for e in m.edits:
        path = tree / e.file
        if e.file not in texts:
            if not path.is_file():
                raise MutationError(f"mutation {m.name!r}: {e.file} does not exist")
            texts[e.file] = path.read_text()
        _check_edit(m, e, texts[e.file])
        texts[e.file] = texts[e.file].replace(e.find, e.replace, 1)


def apply_mutation(m: Mutation, tree: Path) -> None:
    """Patch ``tree`` in place (checks everything before writing anything)."""
    check_mutation(m, tree)
    texts: dict[str, str] = {}
    for e in m.edits:
        text = texts.get(e.file)
        if text is None:
            text = (tree / e.file).read_text()
        texts[e.file] = text.replace(e.find, e.replace, 1)
    for rel, text in texts.items():
        (tree / rel).write_text(text)


PROBE_SOURCE = f'''\
"""Written by tools/mutate.py: fail the run unless rankcore (and executors) come from the copy."""
import importlib
import os

import pytest


def pytest_collection_finish(session):
    expected = os.path.realpath(os.environ["RANKCORE_MUTATE_TREE"])
    for name in ("rankcore", "executors"):
        mod = importlib.import_module(name)
        where = os.path.realpath(mod.__file__)
        if os.path.commonpath([where, expected]) != expected:
            pytest.exit(f"mutate probe: {{name}} was imported from {{where}}, not from the copy {{expected}}",
                        returncode={PROBE_RC})
'''


@dataclass
class Result:
    mutation: str
    status: str
    seconds: float
    detail: str = ""  # killed: the first failing test; error: why
    output: str = field(default="", repr=False)


def _first_failure(output: str) -> str:
    for line in output.splitlines():
        if "mutate probe:" in line:
            return "mutate probe:" + line.split("mutate probe:", 1)[1].rstrip(" !")
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ")[0].split(" ", 1)[1]
    for line in output.splitlines():
        if "error" in line.lower() and "Interrupted" in line:
            return line.strip()
    lines = [ln for ln in output.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def run_pytest(tree: Path, probe_dir: Path, python: str, pytest_args: Sequence[str], timeout: float,
               name: str) -> tuple[int | None, str, float]:
    """Run pytest in ``tree``; return (exit status or None on timeout, output, seconds)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(probe_dir)])
    env["RANKCORE_MUTATE_TREE"] = str(tree)
    env[ENV_VAR] = name
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    cmd = [python, "-m", "pytest", "-p", PROBE_MODULE, *pytest_args]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the pytest we started, and anything it started
        out, _ = proc.communicate()
        rc = None
    return rc, out.decode(errors="replace"), time.monotonic() - t0


def run_one(m: Mutation | None, root: Path, files: Sequence[str], python: str, pytest_args: Sequence[str],
            timeout: float, keep: bool = False) -> Result:
    """Copy the tree, apply ``m`` (None: the unmutated baseline), run the suite, classify."""
    name = m.name if m is not None else "(baseline)"
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f"rankcore-mutant-{name.strip('()')}-"))
    try:
        tree, probe_dir = work / "tree", work / "probe"
        probe_dir.mkdir()
        (probe_dir / f"{PROBE_MODULE}.py").write_text(PROBE_SOURCE)
        copy_tree(root, tree, files)
        if m is not None:
            try:
                apply_mutation(m, tree)
            except MutationError as exc:
                return Result(name, ERROR, time.monotonic() - t0, str(exc).splitlines()[0])
        rc, out, _ = run_pytest(tree, probe_dir, python, pytest_args, timeout, name)
        secs = time.monotonic() - t0
        if rc is None:
            return Result(name, TIMEOUT, secs, f"no result after {timeout:.0f} s", out)
        if rc == 0:
            return Result(name, SURVIVED, secs, "", out)
        if rc == PROBE_RC:
            return Result(name, ERROR, secs, _first_failure(out), out)
        if rc in (1, 2):  # tests failed / collection errors (e.g. the mutant does not import)
            return Result(name, KILLED, secs, _first_failure(out), out)
        return Result(name, ERROR, secs, f"pytest exited {rc}: {_first_failure(out)}", out)
    finally:
        if keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def sweep(mutations: Sequence[Mutation], root: Path, files: Sequence[str], python: str,
          pytest_args: Sequence[str], timeout: float, jobs: int = 1, keep: bool = False,
          on_result: Callable[[Result], None] | None = None) -> list[Result]:
    """Run every mutation on a copy of ``files`` of ``root`` (``jobs`` at a time);
    results in the order of ``mutations``."""
    results: dict[str, Result] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(run_one, m, root, files, python, pytest_args, timeout, keep): m for m in mutations}
        for fut in as_completed(futures):
            res = fut.result()
            results[res.mutation] = res
            if on_result is not None:
                on_result(res)
    return [results[m.name] for m in mutations]


def select(names: Sequence[str]) -> list[Mutation]:
    by_name = {m.name: m for m in MUTATIONS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise click.BadParameter(f"unknown mutation(s) {unknown}; see --list", param_hint="--only")
    return [by_name[n] for n in names] if names else list(MUTATIONS)


def _default_python(root: Path) -> str:
    venv = root / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _print_table(results: Sequence[Result], wall: float) -> None:
    from rich.console import Console
    from rich.table import Table

    style = {KILLED: "green", TIMEOUT: "yellow", SURVIVED: "bold red", ERROR: "bold magenta"}
    breaks = {m.name: m.breaks for m in MUTATIONS}
    table = Table(title=f"mutation sweep ({len(results)} mutations, {wall:.0f} s wall)")
    table.add_column("mutation")
    table.add_column("status")
    table.add_column("s", justify="right")
    table.add_column("killed by / why")
    for r in results:
        table.add_row(r.mutation, f"[{style[r.status]}]{r.status.upper()}[/]", f"{r.seconds:.0f}",
                      r.detail if r.status != SURVIVED else f"nothing: {breaks.get(r.mutation, '')}")
    Console(width=200).print(table)


def markdown(results: Sequence[Result]) -> str:
    breaks = {m.name: m.breaks for m in MUTATIONS}
    lines = ["| mutation | rule it breaks | status | s | killed by |", "|---|---|---|--:|---|"]
    for r in results:
        lines.append(f"| `{r.mutation}` | {breaks.get(r.mutation, '')} | {r.status.upper()} | {r.seconds:.0f} | "
                     f"{('`' + r.detail + '`') if r.detail and r.status == KILLED else r.detail or '-'} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------ CLI
@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--only", "only", multiple=True, metavar="NAME", help="Run only this mutation (repeatable).")
@click.option("--list", "list_", is_flag=True, help="List the mutations and the rule each breaks, then exit.")
@click.option("--check", is_flag=True, help="Only check that every snippet matches the code exactly once.")
@click.option("--jobs", "-j", default=1, show_default=True, type=click.IntRange(1), help="Mutants run at once.")
@click.option("--timeout", default=600.0, show_default=True, type=float, help="Seconds per mutant run.")
@click.option("--pytest-args", default=DEFAULT_PYTEST_ARGS, show_default=True, help="Arguments for pytest.")
@click.option("--seed", default="0", show_default=True,
              help="--hypothesis-seed for every run (reproducible sweeps); 'random' for none.")
@click.option("--no-baseline", is_flag=True, help="Skip the unmutated run that must pass first.")
@click.option("--rev", default=None, metavar="REV",
              help="Mutate this commit (e.g. HEAD) instead of the working tree as it is now.")
@click.option("--python", "python", default=None, help="Interpreter (default: the repo's .venv/bin/python).")
@click.option("--keep", is_flag=True, help="Keep the temporary copies (to inspect a mutant).")
@click.option("--markdown", "md_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the results as a Markdown table to this file.")
@click.option("--show-survivors", is_flag=True, help="Print the pytest output of surviving mutants.")
def main(only: tuple[str, ...], list_: bool, check: bool, jobs: int, timeout: float, pytest_args: str,
         seed: str, no_baseline: bool, rev: str | None, python: str | None, keep: bool, md_path: str | None,
         show_survivors: bool) -> None:
    """Apply rule-breaking mutations to rankcore one at a time; fail if the tests miss any."""
    mutations = select(only)
    if list_:
        for m in mutations:
            click.echo(f"{m.name:40} {', '.join(m.files):22} {m.breaks}")
        return
    work = Path(tempfile.mkdtemp(prefix="rankcore-mutate-source-"))
    try:
        try:
            source = work / "source"
            files = snapshot(ROOT, source, rev)
        except MutationError as exc:
            raise click.ClickException(str(exc)) from None
        bad = []
        for m in mutations:
            try:
                check_mutation(m, source)
            except MutationError as exc:
                bad.append(str(exc))
        if bad:
            click.echo("\n".join(bad), err=True)
            sys.exit(2)
        if rev is None:
            what = "the working tree"
        else:
            sha = subprocess.run(["git", "rev-parse", "--short=10", rev], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip()
            what = f"commit {rev} ({sha})"
        if check:
            click.echo(f"all {len(mutations)} mutations match {what} exactly once")
            return
        _run(mutations, source, files, what, python or _default_python(ROOT), pytest_args, seed, timeout,
             jobs, keep, no_baseline, md_path, show_survivors)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(mutations: Sequence[Mutation], source: Path, files: Sequence[str], what: str, python: str,
         pytest_args: str, seed: str, timeout: float, jobs: int, keep: bool, no_baseline: bool,
         md_path: str | None, show_survivors: bool) -> None:
    args = shlex.split(pytest_args)
    if seed != "random":
        args.append(f"--hypothesis-seed={seed}")
    t0 = time.monotonic()
    click.echo(f"{len(mutations)} mutations of {what} ({len(files)} files); pytest {' '.join(args)}; "
               f"--jobs {jobs}", err=True)
    if not no_baseline:
        base = run_one(None, source, files, python, args, timeout, keep)
        if base.status != SURVIVED:
            click.echo(base.output[-4000:], err=True)
            click.echo(f"baseline (no mutation) {base.status}: {base.detail}; the suite must pass "
                       f"before a mutation sweep means anything", err=True)
            sys.exit(2)
        click.echo(f"baseline (no mutation) passed in {base.seconds:.0f} s", err=True)

    done = [0]

    def progress(r: Result) -> None:
        done[0] += 1
        click.echo(f"[{done[0]}/{len(mutations)}] {r.mutation}: {r.status} ({r.seconds:.0f} s) {r.detail}",
                   err=True)

    results = sweep(mutations, source, files, python, args, timeout, jobs, keep, progress)
    wall = time.monotonic() - t0
    _print_table(results, wall)
    if show_survivors:
        for r in results:
            if r.status == SURVIVED:
                click.echo(f"--- {r.mutation}\n{r.output[-2000:]}")
    counts = {s: sum(r.status == s for r in results) for s in (KILLED, TIMEOUT, SURVIVED, ERROR)}
    click.echo(f"{counts[KILLED]} killed, {counts[TIMEOUT]} timed out, {counts[SURVIVED]} survived, "
               f"{counts[ERROR]} errors; {wall:.0f} s wall with --jobs {jobs}")
    if md_path:
        Path(md_path).write_text(markdown(results))
    if counts[ERROR]:
        sys.exit(2)
    if counts[SURVIVED]:
        sys.exit(1)


if __name__ == "__main__":
    main()
