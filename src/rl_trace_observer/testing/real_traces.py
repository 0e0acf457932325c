"""Where the real public traces are: ``../shared/real-traces`` beside the repository, read in place.

Tests and benchmarks both look for them; a git worktree finds them beside its main checkout, since the
shared folder sits next to the repository it belongs to, not next to each worktree.
"""

from __future__ import annotations

from pathlib import Path

REAL_TRACES_REL = "../shared/real-traces"  # public traces written by others: read in place, never copied in


def main_checkout(root: Path) -> Path:
    """The main checkout of ``root``: ``root`` itself, or for a git worktree (``.git`` is a file naming
    ``.../.git/worktrees/<name>``) the checkout that owns it."""
    dot_git = root / ".git"
    if not dot_git.is_file():
        return root
    text = dot_git.read_text().strip()
    if not text.startswith("gitdir:"):
        return root
    gitdir = (root / text.partition(":")[2].strip()).resolve()
    common = gitdir / "commondir"
    if common.is_file():
        gitdir = (gitdir / common.read_text().strip()).resolve()
    return gitdir.parent if gitdir.name == ".git" else root


def real_traces_dir(root: Path) -> Path:
    """``../shared/real-traces`` next to the repository at ``root`` (or next to its main checkout)."""
    for base in dict.fromkeys((root, main_checkout(root))):
        path = (base / REAL_TRACES_REL).resolve()
        if path.is_dir():
            return path
    return (root / REAL_TRACES_REL).resolve()
