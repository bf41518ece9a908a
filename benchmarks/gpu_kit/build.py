"""Builds the GPU kit: the cp312 x86-64 wheels raydpfl needs and the GPU image lacks.

    python benchmarks/gpu_kit/build.py              # build .gpukit/ (downloads ~85 MB)
    python benchmarks/gpu_kit/build.py --dry-run    # resolve every wheel name, check, no download
    python benchmarks/gpu_kit/build.py --verify     # check .gpukit/ against its manifest

The GPU machine (Python 3.12, PyTorch with CUDA, no Ray/Opacus/dp-accounting) reaches no
package registry, and each call carries at most 64 MiB: the git working tree plus the
ignored paths it names. So on this CPU machine the kit is built into the ignored folder
``.gpukit/``:

- ``wheels/``: the pins of ``requirements.txt`` for CPython 3.12 on manylinux x86-64
  (``pip download --no-deps --only-binary=:all:``), Ray's wheel repacked as a valid wheel
  without ``ray/jars/`` (the Java worker: ~31 MB of the 79 MB wheel; its RECORD rewritten),
  Opacus' without its stray top-level ``benchmarks``/``examples`` packages;
- ``data/``: Fashion-MNIST's two label files (34 KB; the images, 30 MB, do not fit beside
  Ray, so the GPU run draws seeded stand-in pixels for the real labels: benchmarks/gpu_ray.py);
- ``MANIFEST.json`` (every file's size and sha256, the downloaded Ray wheel's sha256, what
  was dropped, the sizes against the 64 MiB budget) and ``SHA256SUMS`` (``sha256sum -c``).

Checks, offline, on the resolved metadata (also in ``--dry-run``): no pin is already in the
GPU image (``image_packages.txt``), torch is never shipped, and every dependency of every
pin (its extras named in requirements.txt included; markers for CPython 3.12 on Linux
x86-64) is in the kit, in the image, or torch. The build fails if the kit and the working
tree together exceed 64 MiB.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REQUIREMENTS = HERE / "requirements.txt"
IMAGE_PACKAGES = HERE / "image_packages.txt"
KIT = ROOT / ".gpukit"
BUDGET_BYTES = 64 * 2**20  # working tree + carried paths, per call
#: The GPU image's interpreter and platform.
PYTHON_VERSION = "3.12"
ABI = "cp312"
#: manylinux tags pip may take (pip matches each exactly); the image's glibc is >= 2.35.
PLATFORMS = (
    "manylinux2014_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_35_x86_64",
)
#: Environment markers of the GPU image (PEP 508), for the dependency check.
MARKER_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}
#: Never shipped: the image's own CUDA build must be used.
NEVER_SHIP = frozenset({"torch"})
#: Entries dropped from a wheel when repacking it (name -> path prefixes in the wheel):
#: Ray's Java worker (unused: ~31 MB), and the top-level ``benchmarks``/``examples``
#: packages Opacus' wheel carries, which would shadow this repository's benchmarks/.
DROP = {"ray": ("ray/jars/",), "opacus": ("benchmarks/", "examples/")}
#: Label files put in the kit (the images do not fit; see gpu_ray.py's stand-in).
LABEL_FILES = ("train-labels-idx1-ubyte", "t10k-labels-idx1-ubyte")


def normalise(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Pin:
    """One line of requirements.txt: ``name[extras]==version``."""

    name: str
    version: str
    extras: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return normalise(self.name)

    def spec(self, with_extras: bool = False) -> str:
        extras = f"[{','.join(self.extras)}]" if with_extras and self.extras else ""
        return f"{self.name}{extras}=={self.version}"


_PIN = re.compile(
    r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[([A-Za-z0-9_,.\- ]+)\])?==([A-Za-z0-9.+!_-]+)$"
)


def parse_requirements(text: str) -> list[Pin]:
    """The pins of a requirements text: one ``name[extras]==version`` a line, ``#`` comments."""
    pins: list[Pin] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _PIN.match(line)
        if m is None:
            raise ValueError(f"requirements line {number}: {line!r} is not name[extras]==version")
        name, extras, version = m.group(1), m.group(2), m.group(3)
        pin = Pin(name, version, tuple(e.strip() for e in extras.split(",")) if extras else ())
        if pin.key in seen:
            raise ValueError(f"requirements line {number}: {name} is pinned twice")
        seen.add(pin.key)
        pins.append(pin)
    return pins


def parse_image_packages(text: str) -> set[str]:
    """Normalised names of a whitespace-separated package list (``#`` comments)."""
    return {normalise(w) for line in text.splitlines() for w in line.split("#", 1)[0].split()}


def load_inputs() -> tuple[list[Pin], set[str]]:
    return parse_requirements(REQUIREMENTS.read_text()), parse_image_packages(
        IMAGE_PACKAGES.read_text()
    )


# ------------------------------------------------------------------------------ checks
@dataclass
class CheckResult:
    errors: list[str] = field(default_factory=list)
    #: A dependency the image provides under a version bound the image may not meet.
    assumptions: list[str] = field(default_factory=list)


def check_pins(pins: Sequence[Pin], image: set[str]) -> CheckResult:
    """No pin is already in the image, none is never-shipped."""
    out = CheckResult()
    for pin in pins:
        if pin.key in NEVER_SHIP:
            out.errors.append(f"{pin.name}: never shipped (the image's own build is used)")
        elif pin.key in image:
            out.errors.append(f"{pin.name}: already in the GPU image; do not ship it")
    return out


def check_closure(
    pins: Sequence[Pin], requires: Mapping[str, Sequence[str]], image: set[str]
) -> CheckResult:
    """Every dependency of every pin is in the kit, the image or `NEVER_SHIP`.

    Args:
        pins: the kit's pins.
        requires: normalised pin name -> its ``Requires-Dist`` strings.
        image: normalised names of the image's packages.
    """
    from packaging.requirements import Requirement

    out = CheckResult()
    kit = {p.key: p for p in pins}
    for pin in pins:
        if pin.key not in requires:
            out.errors.append(f"{pin.name}: no metadata resolved")
            continue
        for text in requires[pin.key]:
            req = Requirement(text)
            if req.marker is not None and not any(
                req.marker.evaluate({**MARKER_ENV, "extra": extra}) for extra in ("", *pin.extras)
            ):
                continue
            dep = normalise(req.name)
            if dep in kit:
                if not req.specifier.contains(kit[dep].version, prereleases=True):
                    out.errors.append(
                        f"{pin.name} needs {req.name}{req.specifier}, the kit pins "
                        f"{kit[dep].version}"
                    )
            elif dep in image or dep in NEVER_SHIP:
                if str(req.specifier):
                    out.assumptions.append(f"{pin.name} needs {req.name}{req.specifier} (image)")
            else:
                out.errors.append(f"{pin.name} needs {req}: neither in the kit nor in the image")
    return out


# ------------------------------------------------------------------------------- pip
def _pip_target_args() -> list[str]:
    args = ["--only-binary=:all:", "--python-version", PYTHON_VERSION]
    args += ["--implementation", "cp", "--abi", ABI]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    return args


def resolve_command(pins: Sequence[Pin], report: Path) -> list[str]:
    """pip resolving each pin's cp312 wheel without downloading it (PEP 658 metadata)."""
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
    cmd += ["--no-deps", "--disable-pip-version-check", "-q", *_pip_target_args()]
    cmd += ["--retries", "2", "--timeout", "10"]  # an unreachable index fails fast
    # pip 23 takes platform options only with --target, even in a dry run
    cmd += ["--target", str(report.parent / "target"), "--report", str(report)]
    return cmd + [p.spec() for p in pins]


def download_command(pins: Sequence[Pin], dest: Path) -> list[str]:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    cmd += ["-q", *_pip_target_args(), "-d", str(dest)]
    return cmd + [p.spec() for p in pins]


#: pip's words when the index cannot be reached (as opposed to a name that does not resolve).
NETWORK_ERRORS = (
    "NewConnectionError",
    "Max retries exceeded",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Connection refused",
    "ProxyError",
    "SSLError",
)


class IndexUnreachable(RuntimeError):
    """pip could not reach the package index."""


def run_pip(cmd: Sequence[str], timeout: float | None = None) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise IndexUnreachable(f"pip did not finish in {timeout:g} s") from None
    if proc.returncode != 0:
        text = proc.stdout + proc.stderr
        # pip also says "No matching distribution" when it could not reach the index
        if any(word in text for word in NETWORK_ERRORS):
            line = next(ln for ln in text.splitlines() if any(w in ln for w in NETWORK_ERRORS))
            raise IndexUnreachable(line.strip()[-300:])
        raise RuntimeError(f"{' '.join(cmd[:5])} ... failed:\n{text.strip()}")


def resolve(pins: Sequence[Pin], timeout: float | None = None) -> dict[str, dict[str, Any]]:
    """Normalised name -> {filename, url, sha256, version, requires_dist} from pip's report."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        run_pip(resolve_command(pins, report), timeout)
        data = json.loads(report.read_text())
    out: dict[str, dict[str, Any]] = {}
    for item in data["install"]:
        meta, info = item["metadata"], item["download_info"]
        url = info["url"]
        out[normalise(meta["name"])] = {
            "filename": url.rsplit("/", 1)[-1].split("#", 1)[0],
            "url": url,
            "sha256": info.get("archive_info", {}).get("hashes", {}).get("sha256"),
            "version": meta["version"],
            "requires_dist": list(meta.get("requires_dist") or []),
        }
    return out


def check_resolved(pins: Sequence[Pin], resolved: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Each pin resolved to a cp312 or pure wheel of exactly its version."""
    errors = []
    for pin in pins:
        got = resolved.get(pin.key)
        if got is None:
            errors.append(f"{pin.name}: not resolved")
            continue
        name = got["filename"]
        tags = name[:-4].split("-")[-3:] if name.endswith(".whl") else []
        if got["version"] != pin.version:
            errors.append(f"{pin.name}: resolved {got['version']}, pinned {pin.version}")
        elif not tags or not (
            tags[0] in ("py3", "cp312", "py2.py3") and tags[1] in ("none", "cp312", "abi3")
        ):
            errors.append(f"{pin.name}: {name} is not a cp312/py3 wheel")
        elif tags[2] != "any" and not tags[2].endswith("x86_64"):
            errors.append(f"{pin.name}: {name} is not for x86-64")
    return errors


# --------------------------------------------------------------------------- wheels
def wheel_requires(path: Path) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel's own METADATA (not of vendored packages)."""
    with zipfile.ZipFile(path) as z:
        (meta,) = [n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        text = z.read(meta).decode()
    head = text.split("\n\n", 1)[0]
    return [
        line.split(":", 1)[1].strip()
        for line in head.splitlines()
        if line.startswith("Requires-Dist:")
    ]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def repack_wheel(src: Path, dest: Path, drop_prefixes: Iterable[str]) -> dict[str, Any]:
    """Writes `src` to `dest` without the entries under `drop_prefixes`: a valid wheel.

    The kept entries are copied unchanged (bytes, permission bits, timestamps) and
    recompressed; the dist-info RECORD loses the dropped files' lines and nothing else,
    so every kept file's recorded hash still holds.

    Returns:
        What was dropped: {"dropped_files", "dropped_bytes", "dropped_compressed_bytes"}.
    """
    prefixes = tuple(drop_prefixes)
    dropped, dropped_bytes, dropped_compressed = 0, 0, 0
    with zipfile.ZipFile(src) as zin:
        records = [n for n in zin.namelist() if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
        if len(records) != 1:
            raise ValueError(f"{src.name}: expected one dist-info RECORD, found {len(records)}")
        record_name = records[0]
        tmp = dest.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
            for info in zin.infolist():
                if info.filename.startswith(prefixes):
                    dropped += 1
                    dropped_bytes += info.file_size
                    dropped_compressed += info.compress_size
                    continue
                data = zin.read(info)
                if info.filename == record_name:
                    lines = data.decode().splitlines(keepends=True)
                    data = "".join(
                        ln for ln in lines if not ln.split(",", 1)[0].startswith(prefixes)
                    ).encode()
                out = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                out.external_attr = info.external_attr  # keeps the executables executable
                out.create_system = info.create_system
                out.compress_type = zipfile.ZIP_DEFLATED
                zout.writestr(out, data, compresslevel=9)
        tmp.replace(dest)
    if dropped == 0:
        raise ValueError(f"{src.name}: nothing under {prefixes} to drop")
    return {
        "dropped_prefixes": list(prefixes),
        "dropped_files": dropped,
        "dropped_bytes": dropped_bytes,
        "dropped_compressed_bytes": dropped_compressed,
    }


def check_wheel_record(path: Path) -> list[str]:
    """A wheel's RECORD lists exactly its files, each with its sha256 (RECORD excepted)."""
    import base64

    errors = []
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if not n.endswith("/")]
        (record,) = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
        rows = {}
        for line in z.read(record).decode().splitlines():
            if line.strip():
                fname, digest, _size = line.rsplit(",", 2)
                rows[fname] = digest
        for n in names:
            if n == record:
                continue
            if n not in rows:
                errors.append(f"{path.name}: {n} missing from RECORD")
                continue
            algo, _, want = rows.pop(n).partition("=")
            got = base64.urlsafe_b64encode(hashlib.new(algo, z.read(n)).digest()).rstrip(b"=")
            if got.decode() != want:
                errors.append(f"{path.name}: {n} does not match its RECORD hash")
        rows.pop(record, None)
        errors += [f"{path.name}: RECORD lists {n}, not in the wheel" for n in rows]
    return errors


# ---------------------------------------------------------------------------- sizes
def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of what a device call sends besides carried paths: tracked files and
    untracked files git does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    total = 0
    for name in out.decode().split("\0"):
        p = root / name
        if name and p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def write_manifest(kit: Path, extra: Mapping[str, Any]) -> dict[str, Any]:
    """Writes MANIFEST.json and SHA256SUMS over every file of `kit` (but these two)."""
    files = {}
    for p in sorted(kit.rglob("*")):
        rel = p.relative_to(kit).as_posix()
        if p.is_file() and rel not in ("MANIFEST.json", "SHA256SUMS"):
            files[rel] = {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
    (kit / "SHA256SUMS").write_text("".join(f"{v['sha256']}  {k}\n" for k, v in files.items()))
    manifest = {**extra, "files": files}
    manifest["kit_bytes"] = dir_bytes(kit) + len(json.dumps(manifest, indent=2)) + 64
    (kit / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    manifest["kit_bytes"] = dir_bytes(kit)
    (kit / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def verify_kit(kit: Path) -> list[str]:
    """Files of `kit` against its MANIFEST.json: present, same size and sha256, no others."""
    manifest = json.loads((kit / "MANIFEST.json").read_text())
    errors = []
    listed = manifest["files"]
    for rel, want in listed.items():
        p = kit / rel
        if not p.is_file():
            errors.append(f"{rel}: missing")
        elif p.stat().st_size != want["bytes"] or sha256_file(p) != want["sha256"]:
            errors.append(f"{rel}: size or sha256 differs from MANIFEST.json")
    for p in kit.rglob("*"):
        rel = p.relative_to(kit).as_posix()
        if p.is_file() and rel not in listed and rel not in ("MANIFEST.json", "SHA256SUMS"):
            errors.append(f"{rel}: not in MANIFEST.json")
    return errors


# ---------------------------------------------------------------------------- build
def find_labels() -> dict[str, Path]:
    """Fashion-MNIST's label files on this machine (raydpfl's own search), if any."""
    sys.path.insert(0, str(ROOT))
    from raydpfl.data.datasets import DatasetNotFoundError, find_dataset_files

    try:
        files = find_dataset_files("fashion_mnist")
    except DatasetNotFoundError:
        return {}
    return {
        f"{n}.gz" if files[k].suffix == ".gz" else n: files[k]
        for k, n in (("train_labels", LABEL_FILES[0]), ("test_labels", LABEL_FILES[1]))
    }


def _report_checks(title: str, result: CheckResult) -> None:
    for a in result.assumptions:
        print(f"  assumed: {a}")
    for e in result.errors:
        print(f"  ERROR: {e}")
    print(f"{title}: {'ok' if not result.errors else f'{len(result.errors)} error(s)'}")


def dry_run(timeout: float | None = None) -> dict[str, Any]:
    """Resolves every wheel name on the index and runs every check; downloads nothing."""
    pins, image = load_inputs()
    result = check_pins(pins, image)
    resolved = resolve(pins, timeout=timeout)
    result.errors += check_resolved(pins, resolved)
    closure = check_closure(pins, {k: v["requires_dist"] for k, v in resolved.items()}, image)
    result.errors += closure.errors
    result.assumptions += closure.assumptions
    for pin in pins:
        got = resolved.get(pin.key)
        if got:
            print(f"  {got['filename']}")
    _report_checks(f"dry run: {len(pins)} pins resolved for CPython {PYTHON_VERSION}", result)
    return {
        "pins": [p.spec(True) for p in pins],
        "resolved": resolved,
        "errors": result.errors,
        "assumptions": result.assumptions,
    }


def build(kit: Path = KIT, keep_download: Path | None = None) -> dict[str, Any]:
    pins, image = load_inputs()
    result = check_pins(pins, image)
    if result.errors:
        _report_checks("pins", result)
        raise SystemExit(2)
    staging = Path(tempfile.mkdtemp(prefix="gpukit-"))
    try:
        download = keep_download or staging / "download"
        download.mkdir(parents=True, exist_ok=True)
        have = {p.name for p in download.glob("*.whl")}
        missing = [p for p in pins if not any(_wheel_is(n, p) for n in have)]
        if missing:
            print(f"downloading {len(missing)} wheels for CPython {PYTHON_VERSION} ...")
            run_pip(download_command(missing, download))
        new = staging / "kit"
        (new / "wheels").mkdir(parents=True)
        repacked: dict[str, Any] = {}
        requires: dict[str, list[str]] = {}
        for pin in pins:
            (whl,) = [p for p in download.glob("*.whl") if _wheel_is(p.name, pin)]
            requires[pin.key] = wheel_requires(whl)
            target = new / "wheels" / whl.name
            if pin.key in DROP:
                info = repack_wheel(whl, target, DROP[pin.key])
                errors = check_wheel_record(target)
                if errors:
                    raise SystemExit("\n".join(errors))
                repacked[whl.name] = {
                    **info,
                    "original_bytes": whl.stat().st_size,
                    "original_sha256": sha256_file(whl),
                    "repacked_bytes": target.stat().st_size,
                }
                print(
                    f"  {whl.name}: {whl.stat().st_size / 2**20:.1f} MB -> "
                    f"{target.stat().st_size / 2**20:.1f} MB without {', '.join(DROP[pin.key])}"
                )
            else:
                shutil.copy2(whl, target)
        closure = check_closure(pins, requires, image)
        _report_checks("dependencies", closure)
        if closure.errors:
            raise SystemExit(2)
        labels = find_labels()
        if labels:
            (new / "data").mkdir()
            for name, src in labels.items():
                shutil.copy2(src, new / "data" / name)
        else:
            print("  warning: Fashion-MNIST labels not found; the GPU run will draw seeded labels")
        tree = tree_bytes()
        extra = {
            "built_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": "python benchmarks/gpu_kit/build.py",
            "target": {"python": PYTHON_VERSION, "abi": ABI, "platforms": list(PLATFORMS)},
            "pins": [p.spec(True) for p in pins],
            "repacked": repacked,
            "labels": sorted(labels),
            "assumptions": closure.assumptions,
            "install": "python3 -m pip install --no-index --no-deps --no-compile "
            "--target SITE .gpukit/wheels/*.whl",
            "tree_bytes_at_build": tree,
            "budget_bytes": BUDGET_BYTES,
        }
        manifest = write_manifest(new, extra)
        total = manifest["kit_bytes"] + tree
        print(
            f"kit {manifest['kit_bytes'] / 2**20:.2f} MiB + working tree {tree / 2**20:.2f} MiB "
            f"= {total / 2**20:.2f} MiB of {BUDGET_BYTES / 2**20:.0f} MiB "
            f"({(BUDGET_BYTES - total) / 2**20:.2f} MiB to spare)"
        )
        if total > BUDGET_BYTES:
            raise SystemExit(
                "the kit and the working tree exceed the 64 MiB a device call carries"
            )
        if kit.exists():
            shutil.rmtree(kit)
        shutil.move(str(new), kit)
        print(f"wrote {kit}")
        return manifest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _wheel_is(filename: str, pin: Pin) -> bool:
    name, version = filename.split("-")[:2]
    return normalise(name) == pin.key and version == pin.version


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="resolve and check; download nothing")
    mode.add_argument("--verify", action="store_true", help="check the kit against its manifest")
    ap.add_argument("--kit", type=Path, default=KIT, help="kit folder (default .gpukit/)")
    ap.add_argument("--download-dir", type=Path, help="reuse/keep downloaded wheels here")
    ap.add_argument("--timeout", type=float, default=None, help="pip's limit in --dry-run (s)")
    args = ap.parse_args(argv)
    if args.dry_run:
        try:
            report = dry_run(args.timeout)
        except IndexUnreachable as e:
            print(f"the package index could not be reached: {e}", file=sys.stderr)
            return 3
        return 1 if report["errors"] else 0
    if args.verify:
        errors = verify_kit(args.kit)
        for e in errors:
            print(f"  ERROR: {e}")
        manifest = json.loads((args.kit / "MANIFEST.json").read_text())
        print(
            f"{args.kit}: {len(manifest['files'])} files, {manifest['kit_bytes'] / 2**20:.2f} "
            f"MiB: {'ok' if not errors else 'BROKEN'}"
        )
        return 1 if errors else 0
    build(args.kit, args.download_dir)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    raise SystemExit(main())
