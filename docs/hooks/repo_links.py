"""MkDocs hook: links from the docs to repository files outside docs/.

The docs link files that live elsewhere in the repository (REPRODUCTION.md,
benchmarks/README.md, cluster/README.md, a paper's folder) with ordinary relative links,
so they work when docs/*.md is read on a code host. MkDocs knows only docs/, and in
strict mode it fails on such links; this hook makes them first-class instead of
silencing them:

- every such link must point to a file (or a folder with a README.md) that exists in the
  repository, or the build fails naming the page and the link;
- the site serves a copy of the file under ``_repo/`` (Markdown as ``.md.txt``, shown as
  text rather than rendered, since its own links are relative to its own folder), and
  the link is rewritten to it.

Links inside fenced code blocks and inline code are left alone.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

_LINK = re.compile(r"(?<!!)\[([^\]\n]*)\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_SITE_DIR = "_repo"


def _outside_target(page_src: str, target: str, docs_dir: Path) -> str | None:
    """The repository path a link points to when it leaves docs/, else None."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return None
    path = target.split("#", 1)[0]
    if not path:
        return None
    resolved = (docs_dir / posixpath.dirname(page_src) / path).resolve()
    if resolved.is_relative_to(docs_dir.resolve()):
        return None
    root = docs_dir.resolve().parent
    if not resolved.is_relative_to(root):
        raise PluginError(f"{page_src}: the link {target!r} leaves the repository")
    if resolved.is_dir():
        resolved = resolved / "README.md"
    if not resolved.is_file():
        raise PluginError(f"{page_src}: the link {target!r} points to no file in the repository")
    return resolved.relative_to(root).as_posix()


def _served_as(repo_path: str) -> str:
    return f"{_SITE_DIR}/{repo_path}" + (".txt" if repo_path.endswith(".md") else "")


def _prose_links(markdown: str):
    """(match, target) of every link outside code."""
    blanked = _FENCE.sub(lambda m: " " * len(m.group(0)), markdown)
    blanked = _CODE.sub(lambda m: " " * len(m.group(0)), blanked)
    for m in _LINK.finditer(blanked):
        yield m, m.group(2)


def on_files(files, config):
    docs_dir = Path(config["docs_dir"])
    wanted: set[str] = set()
    for f in files.documentation_pages():
        text = Path(f.abs_src_path).read_text(encoding="utf-8")
        for _, target in _prose_links(text):
            repo_path = _outside_target(f.src_uri, target, docs_dir)
            if repo_path is not None:
                wanted.add(repo_path)
    root = docs_dir.resolve().parent
    for repo_path in sorted(wanted):
        files.append(
            File.generated(config, _served_as(repo_path), abs_src_path=str(root / repo_path))
        )
    return files


def on_page_markdown(markdown, page, config, files):
    docs_dir = Path(config["docs_dir"])
    src = page.file.src_uri
    pieces, last = [], 0
    for m, target in _prose_links(markdown):
        repo_path = _outside_target(src, target, docs_dir)
        if repo_path is None:
            continue
        new = posixpath.relpath(_served_as(repo_path), posixpath.dirname(src) or ".")
        pieces += [markdown[last : m.start(2)], new]
        last = m.end(2)
    return "".join([*pieces, markdown[last:]])
