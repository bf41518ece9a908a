"""The docs site (issue 50): it builds in strict mode, and its code runs as written.

- `mkdocs build --strict` fails on a broken link, a missing page or anchor, and an API
  reference that does not resolve; links that leave docs/ must point to files of the
  repository (docs/hooks/repo_links.py).
- Every ```python and ```bash block of the pages is executed, in page order, in a fresh
  folder where `configs/`, `examples/` and `cluster/` are the repository's (the docs'
  commands run "from the repository root"). The tutorial's five pages run as one sequence,
  as a reader follows them; every other page alone. A block with a ``title="FILE"`` is
  written to FILE instead (a plug-in, a config), for the blocks after it. ```text blocks are
  output, or commands that need what a test machine lacks (a network, a cloud account);
  ```yaml blocks without a title are config fragments, each validated against the schema
  at its place in a config.
- A block after ``<!-- docs-test: requires raydpfl tune --plugin -->`` needs that option
  of that command; on a tree without it the block is skipped and the test reports it (and
  skips) after running every other block.
- docs/tutorial.ipynb: committed executed, and its cells run.
- README.md: at most 200 lines, its Python example runs, and every link resolves in the
  repository.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

import raydpfl

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
TUTORIAL = ["quickstart.md", "report.md", "own-algorithm.md", "sweep.md", "cluster.md"]
#: Pages whose blocks start Ray (each start ~20 s on 2 cores) or run for long.
RAY_PAGES = {"how-to/sweeps.md"}
#: The loopback cluster tutorial step 5 starts (stopped after the test whatever happens).
TUTORIAL_CLUSTER_PORT = 26391

_FENCE = re.compile(
    r"(?P<pre>(?:^<!-- docs-test: (?P<directive>[^>]*?) -->\n)?)"
    r"^(?P<fence>```+)(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$",
    re.S | re.M,
)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    code: str
    file: str | None = None
    requires: str | None = None


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page that the test runs or writes, in order."""
    text = page.read_text(encoding="utf-8")
    found = []
    for m in _FENCE.finditer(text):
        info = m.group("info").strip()
        language = info.split()[0] if info else ""
        title = re.search(r'title="([^"]+)"', info)
        directive = m.group("directive") or ""
        requires = directive.removeprefix("requires ").strip() if directive else None
        line = text.count("\n", 0, m.start("fence")) + 1
        body = textwrap.dedent(m.group("body"))
        if title:
            found.append(Block(str(page.relative_to(DOCS)), line, language, body, title.group(1)))
        elif language in ("python", "bash"):
            found.append(Block(str(page.relative_to(DOCS)), line, language, body, None, requires))
    return found


# Runs the blocks in one process, in order (python blocks share one namespace, like a
# notebook's cells); prints each block's place before it runs, so a failure names it.
_RUNNER = r"""
import json, subprocess, sys, traceback
from pathlib import Path

namespace = {"__name__": "__main__"}
skipped = []
for block in json.loads(Path(sys.argv[1]).read_text()):
    where = f"{block['page']}:{block['line']}"
    if block["requires"]:
        *command, option = block["requires"].split()
        help_text = subprocess.run([*command, "--help"], capture_output=True, text=True).stdout
        if option not in help_text:
            print(f"=== {where}: skipped, needs `{block['requires']}`", flush=True)
            skipped.append(f"{where} needs `{block['requires']}`")
            continue
    print(f"=== {where} ({block['file'] or block['language']})", flush=True)
    if block["file"]:
        Path(block["file"]).write_text(block["code"])
    elif block["language"] == "python":
        try:
            exec(compile(block["code"], where, "exec"), namespace)
        except BaseException:
            traceback.print_exc()
            sys.exit(f"FAILED: the python block at {where}")
    else:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", block["code"]])
        if done.returncode != 0:
            sys.exit(f"FAILED: the bash block at {where} exited {done.returncode}")
Path("skipped.json").write_text(json.dumps(skipped))
"""


def run_blocks(found: list[Block], cwd: Path, timeout: int) -> list[str]:
    """Runs `found` in `cwd` (the repository's configs/, examples/, cluster/ linked in);
    fails the test with the output on the first failing block; returns skipped blocks."""
    for name in ("configs", "examples", "cluster"):
        (cwd / name).symlink_to(ROOT / name)
    (cwd / "blocks.json").write_text(json.dumps([asdict(b) for b in found]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")} | {
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "MPLBACKEND": "Agg",
        "PYTHONUNBUFFERED": "1",
    }
    bin_dir = str(Path(sys.executable).parent)  # the `raydpfl` script of this interpreter
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", _RUNNER, "blocks.json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-15_000:]
    return json.loads((cwd / "skipped.json").read_text())


def _pages() -> list[str]:
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    return [p for p in pages if not p.startswith("tutorial/") and blocks(DOCS / p)]


def _page_param(page: str):
    marks = [pytest.mark.slow]
    if page in RAY_PAGES:
        marks.append(pytest.mark.ray)
    return pytest.param(page, marks=marks, id=page)


def test_every_runnable_block_is_on_a_page_the_tests_run():
    runnable = {b.page for p in DOCS.rglob("*.md") for b in blocks(p) if not b.file}
    tested = set(_pages()) | {f"tutorial/{p}" for p in TUTORIAL}
    assert runnable <= tested
    assert set(TUTORIAL) == {p.name for p in (DOCS / "tutorial").glob("*.md")} - {"index.md"}


def _yaml_fragments() -> list[tuple[str, str]]:
    """(page, text) of every ```yaml block without a title (config fragments)."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"^```yaml[ \t]*\n(.*?)^```", text, re.S | re.M):
            found.append((str(page.relative_to(DOCS)), m.group(1)))
    return found


@pytest.mark.parametrize(
    ("page", "text"), _yaml_fragments(), ids=[p for p, _ in _yaml_fragments()]
)
def test_every_config_fragment_of_the_docs_is_valid(page, text):
    """A fragment is checked at its place in a config: a whole experiment, a data section,
    or a tune: section on the quickstart (the schema, not the data)."""
    import yaml

    from raydpfl.config import config_from_dict
    from raydpfl.tune import parse_sweep

    raw = yaml.safe_load(text)
    root = next(iter(raw))
    if root == "tune":
        base = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
        parse_sweep({**base, **raw})
    elif root in ("data", "model", "algorithm", "privacy"):
        config_from_dict({"experiment": raw})
    else:
        assert root in ("experiment", "runtime"), f"{page}: a fragment rooted at {root!r}"
        config_from_dict(raw)


@pytest.mark.slow
@pytest.mark.ray
def test_the_tutorial_runs_as_written(tmp_path):
    found = [b for page in TUTORIAL for b in blocks(DOCS / "tutorial" / page)]
    try:
        skipped = run_blocks(found, tmp_path, timeout=1200)
    finally:  # step 5's two-node cluster, whatever happened
        subprocess.run(
            [
                str(ROOT / "cluster" / "stop_local_cluster.sh"),
                "--port",
                str(TUTORIAL_CLUSTER_PORT),
            ],
            capture_output=True,
            timeout=120,
        )
    if skipped:
        pytest.skip("every other block ran; skipped: " + "; ".join(skipped))


@pytest.mark.parametrize("page", [_page_param(p) for p in _pages()])
def test_the_page_runs_as_written(page, tmp_path):
    skipped = run_blocks(blocks(DOCS / page), tmp_path, timeout=900)
    if skipped:
        pytest.skip("every other block ran; skipped: " + "; ".join(skipped))


@pytest.mark.slow
def test_the_site_builds_in_strict_mode(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("material")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    site = tmp_path / "site"
    # the API reference was generated from the docstrings, and repository links are served
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert "run_simulation" in api and "Poisson(q) subsampling" in api
    assert (site / "_repo" / "REPRODUCTION.md.txt").is_file()
    assert (site / "tutorial.ipynb").is_file()


def test_a_link_out_of_docs_to_a_missing_file_fails_the_build(tmp_path):
    pytest.importorskip("mkdocs")
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import repo_links
    finally:
        sys.path.remove(str(DOCS / "hooks"))
    from mkdocs.exceptions import PluginError

    assert repo_links._outside_target("how-to/x.md", "../../REPRODUCTION.md", DOCS) == (
        "REPRODUCTION.md"
    )
    assert repo_links._outside_target("how-to/x.md", "../../cluster/", DOCS) == "cluster/README.md"
    assert repo_links._outside_target("how-to/x.md", "audit.md#top", DOCS) is None
    with pytest.raises(PluginError, match="no file"):
        repo_links._outside_target("how-to/x.md", "../../NO_SUCH_FILE.md", DOCS)
    links = [t for _, t in repo_links._prose_links("[a](x.md) `[b](y.md)`\n```\n[c](z.md)\n```\n")]
    assert links == ["x.md"]


# --------------------------------------------------------------------------------------- #
# The notebook
# --------------------------------------------------------------------------------------- #
NOTEBOOK = DOCS / "tutorial.ipynb"


def _code_cells() -> list[dict]:
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def test_the_notebook_is_committed_executed():
    cells = _code_cells()
    assert [c["execution_count"] for c in cells] == list(range(1, len(cells) + 1)), (
        "re-execute it: python docs/tools/execute_notebook.py"
    )
    assert all(c["outputs"] for c in cells)
    errors = [o for c in cells for o in c["outputs"] if o["output_type"] == "error"]
    assert errors == []
    images = [o for c in cells for o in c["outputs"] if "image/png" in o.get("data", {})]
    assert images, "the plot cell shows its figure"


@pytest.mark.slow
def test_the_notebook_runs(tmp_path):
    found = [
        Block("tutorial.ipynb", i, "python", "".join(c["source"]))
        for i, c in enumerate(_code_cells(), 1)
    ]
    run_blocks(found, tmp_path, timeout=900)


# --------------------------------------------------------------------------------------- #
# README and conventions
# --------------------------------------------------------------------------------------- #
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_short_and_every_link_resolves():
    assert len(README.splitlines()) <= 200
    assert "shared/" not in README  # specs and design notes are not in the repository
    for target in re.findall(r"\]\(([^)\s]+)\)", README):
        if re.match(r"^[a-z]+:", target):
            continue
        assert (ROOT / target.split("#")[0]).exists(), f"README links a missing {target}"


def test_the_readme_install_uses_the_cpu_wheel_index():
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in README


@pytest.mark.slow
def test_the_readme_python_example_runs(tmp_path):
    (example,) = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(example.strip().splitlines()) <= 12
    run_blocks([Block("README.md", 0, "python", example)], tmp_path, timeout=600)


def test_raydpfl_version_prints_the_package_version():
    done = subprocess.run(
        [sys.executable, "-m", "raydpfl", "--version"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == f"raydpfl {raydpfl.__version__}"


def test_license_citation_and_changelog_agree_with_the_package():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == raydpfl.__version__
    assert project["license"] == {"text": "Apache-2.0"}
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    citation = (ROOT / "CITATION.cff").read_text()
    assert f"version: {raydpfl.__version__}" in citation and "license: Apache-2.0" in citation
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog and f"## [{raydpfl.__version__}]" in changelog


def test_ray_is_pinned_to_the_version_the_tests_run_on():
    import ray
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (ray_dep,) = [d for d in deps if d.startswith("ray")]
    low, high = re.fullmatch(r"ray\[tune\]>=([\d.]+),<([\d.]+)", ray_dep).groups()
    version = tuple(int(x) for x in ray.__version__.split(".")[:2])
    assert (
        tuple(int(x) for x in low.split(".")[:2])
        <= version
        < tuple(int(x) for x in high.split(".")[:2])
    )


def test_the_docs_extra_lists_the_site_tools_and_dev_installs_them():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for tool in ("mkdocs-material", "mkdocstrings[python]"):
        assert any(d.startswith(tool) for d in extras["docs"])
        assert any(d.startswith(tool) for d in extras["dev"])
    assert shutil.which("bash")  # the docs' shell blocks run under bash
