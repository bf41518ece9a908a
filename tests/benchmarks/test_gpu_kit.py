"""benchmarks/gpu_kit/build.py: the GPU kit's pins, checks, repacking and manifest.

Offline except `test_dry_run_resolves_every_wheel`, which asks the package index for the
cp312 wheel of every pin (metadata only) and is skipped, saying so, when pip cannot reach it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.benchmarks.script_module import load_script

ROOT = Path(__file__).resolve().parents[2]


def _module():
    return load_script("benchmarks_gpu_kit_build", ROOT / "benchmarks" / "gpu_kit" / "build.py")


def test_pins_parse_and_none_is_in_the_image():
    kit = _module()
    pins, image = kit.load_inputs()
    names = {p.key for p in pins}
    assert {"ray", "opacus", "dp-accounting"} <= names
    assert "torch" not in names and "torch" in image
    ray = next(p for p in pins if p.key == "ray")
    assert ray.extras == ("tune",) and ray.spec() == f"ray=={ray.version}"
    assert kit.check_pins(pins, image).errors == []
    # what the issue says the image has
    assert {"numpy", "scipy", "pyarrow", "pandas", "grpcio", "msgpack", "protobuf"} <= image
    assert {"pyyaml", "aiohttp", "nvidia-ml-py"} <= image


def test_parse_requirements_refuses_what_it_cannot_pin():
    kit = _module()
    assert kit.parse_requirements("# c\nA_b.c[x, y]==1.0  # why\n") == [
        kit.Pin("A_b.c", "1.0", ("x", "y"))
    ]
    with pytest.raises(ValueError, match="line 1"):
        kit.parse_requirements("ray>=2\n")
    with pytest.raises(ValueError, match="pinned twice"):
        kit.parse_requirements("Ray==1\nray==2\n")


def test_pins_already_in_the_image_or_torch_are_refused():
    kit = _module()
    pins = kit.parse_requirements("numpy==2.0\ntorch==2.11.0\nray==2.60.0\n")
    errors = kit.check_pins(pins, {"numpy", "torch"}).errors
    assert len(errors) == 2
    assert "already in the GPU image" in errors[0] and "never shipped" in errors[1]


def test_closure_follows_markers_and_extras():
    kit = _module()
    pins = kit.parse_requirements("a[tune]==1.0\nb==2.0\n")
    requires = {
        "a": [
            "b>=2",  # in the kit, version fits
            "numpy>=1.2",  # in the image: an assumption
            "click",  # in the image, no bound: nothing to note
            "tensorboardx; extra == 'tune'",  # an extra the kit asks for: must be there
            "memray; extra == 'observability'",  # an extra it does not ask for
            "oldpkg; python_version < '3.10'",  # not for 3.12
            "winpkg; sys_platform == 'win32'",
        ],
        "b": ["torch>=2"],
    }
    result = kit.check_closure(pins, requires, {"numpy", "click"})
    assert result.errors == [
        'a needs tensorboardx; extra == "tune": neither in the kit nor in the image'
    ]
    assert result.assumptions == ["a needs numpy>=1.2 (image)", "b needs torch>=2 (image)"]
    pins = kit.parse_requirements("a==1.0\nb==1.0\n")
    result = kit.check_closure(pins, {"a": ["b>=2"], "b": []}, set())
    assert result.errors == ["a needs b>=2, the kit pins 1.0"]
    assert kit.check_closure(pins, {"a": []}, set()).errors == ["b: no metadata resolved"]


def test_check_resolved_wants_cp312_x86_64_wheels_of_the_pinned_version():
    kit = _module()
    pins = kit.parse_requirements("a==1.0\nb==2.0\nc==3.0\nd==4.0\n")
    resolved = {
        "a": {"filename": "a-1.0-cp312-cp312-manylinux2014_x86_64.whl", "version": "1.0"},
        "b": {"filename": "b-2.0-cp311-cp311-manylinux2014_x86_64.whl", "version": "2.0"},
        "c": {"filename": "c-3.0-py3-none-any.whl", "version": "3.1"},
        "d": {"filename": "d-4.0-cp312-cp312-manylinux2014_aarch64.whl", "version": "4.0"},
    }
    errors = kit.check_resolved(pins, resolved)
    assert [e.split(":")[0] for e in errors] == ["b", "c", "d"]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def _tiny_wheel(path: Path) -> Path:
    """demo-1.0: a package, an executable, and a jars/ folder to drop."""
    files = {
        "demo/__init__.py": b"VALUE = 42\n",
        "demo/bin/tool": b"#!/bin/sh\necho tool\n",
        "demo/jars/big.jar": os.urandom(4096),
        "demo/jars/small.jar": b"jar",
        "demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n"
        b"Requires-Dist: numpy>=1\n\nA long description.\nRequires-Dist: not-a-header\n",
        "demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    whl = path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            mode = 0o755 if name == "demo/bin/tool" else 0o644
            info.external_attr = (0o100000 | mode) << 16
            z.writestr(info, data)
        record = "".join(_record_line(n, d) for n, d in files.items())
        z.writestr("demo-1.0.dist-info/RECORD", record + "demo-1.0.dist-info/RECORD,,\n")
    return whl


def test_repacked_wheel_is_valid_and_installs_offline_without_the_dropped_folder(tmp_path):
    kit = _module()
    src = _tiny_wheel(tmp_path)
    assert kit.check_wheel_record(src) == []
    assert kit.wheel_requires(src) == ["numpy>=1"]  # the header only
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    dest = out_dir / src.name
    info = kit.repack_wheel(src, dest, ["demo/jars/"])
    assert info["dropped_files"] == 2 and info["dropped_bytes"] == 4096 + 3
    assert kit.check_wheel_record(dest) == []
    with zipfile.ZipFile(dest) as z:
        assert not any(n.startswith("demo/jars/") for n in z.namelist())
        assert "jars" not in z.read("demo-1.0.dist-info/RECORD").decode()
        assert (z.getinfo("demo/bin/tool").external_attr >> 16) & 0o111
    with pytest.raises(ValueError, match="nothing under"):
        kit.repack_wheel(dest, tmp_path / "again.whl", ["demo/jars/"])
    # the mechanism the GPU machine uses: pip, no index, no deps, into a fresh folder
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--disable-pip-version-check",
            "--no-compile",
            "--target",
            str(site),
            str(dest),
        ],
        check=True,
        capture_output=True,
    )
    assert (site / "demo" / "__init__.py").read_text() == "VALUE = 42\n"
    assert not (site / "demo" / "jars").exists()
    assert os.access(site / "demo" / "bin" / "tool", os.X_OK)


def test_a_broken_record_is_found(tmp_path):
    kit = _module()
    src = _tiny_wheel(tmp_path)
    bad = tmp_path / "bad.whl"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename == "demo/__init__.py":
                data = b"VALUE = 43\n"
            if item.filename != "demo/jars/small.jar":
                zout.writestr(item, data)
    errors = kit.check_wheel_record(bad)
    assert any("__init__.py does not match" in e for e in errors)
    assert any("lists demo/jars/small.jar" in e for e in errors)


def test_manifest_records_sizes_and_hashes_and_verify_finds_changes(tmp_path):
    kit = _module()
    folder = tmp_path / "kit"
    (folder / "wheels").mkdir(parents=True)
    (folder / "wheels" / "a.whl").write_bytes(b"abc")
    (folder / "data").mkdir()
    (folder / "data" / "labels.gz").write_bytes(b"xyz" * 10)
    manifest = kit.write_manifest(folder, {"pins": ["a==1"]})
    on_disk = json.loads((folder / "MANIFEST.json").read_text())
    assert on_disk["kit_bytes"] == manifest["kit_bytes"] == kit.dir_bytes(folder)
    assert on_disk["files"]["wheels/a.whl"] == {
        "bytes": 3,
        "sha256": hashlib.sha256(b"abc").hexdigest(),
    }
    sums = (folder / "SHA256SUMS").read_text().splitlines()
    assert f"{hashlib.sha256(b'abc').hexdigest()}  wheels/a.whl" in sums
    assert kit.verify_kit(folder) == []
    (folder / "wheels" / "a.whl").write_bytes(b"abd")
    (folder / "extra.txt").write_text("x")
    assert sorted(kit.verify_kit(folder)) == [
        "extra.txt: not in MANIFEST.json",
        "wheels/a.whl: size or sha256 differs from MANIFEST.json",
    ]


def test_commands_target_cpython_312_on_x86_64(tmp_path):
    kit = _module()
    pins = kit.parse_requirements("ray[tune]==2.60.0\n")
    for cmd in (
        kit.resolve_command(pins, tmp_path / "r.json"),
        kit.download_command(pins, tmp_path),
    ):
        text = " ".join(cmd)
        assert "--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312" in text
        assert "--platform manylinux2014_x86_64" in text and "--no-deps" in text
        assert cmd[-1] == "ray==2.60.0"  # extras only steer the dependency check


def test_tree_bytes_counts_what_a_device_call_sends():
    kit = _module()
    size = kit.tree_bytes()
    readme = (ROOT / "README.md").stat().st_size
    assert readme < size < kit.BUDGET_BYTES


def test_the_built_kit_matches_its_manifest():
    kit = _module()
    if not (kit.KIT / "MANIFEST.json").is_file():
        pytest.skip("no .gpukit/ here (built by python benchmarks/gpu_kit/build.py)")
    assert kit.verify_kit(kit.KIT) == []
    manifest = json.loads((kit.KIT / "MANIFEST.json").read_text())
    assert manifest["kit_bytes"] + kit.tree_bytes() <= kit.BUDGET_BYTES


def test_dry_run_resolves_every_wheel():
    kit = _module()
    try:
        report = kit.dry_run(timeout=25)
    except kit.IndexUnreachable as e:
        pytest.skip(f"the package index is not reachable from here: {e}")
    assert report["errors"] == []
    pins, _ = kit.load_inputs()
    assert set(report["resolved"]) == {p.key for p in pins}
    ray = report["resolved"]["ray"]["filename"]
    assert ray.startswith("ray-2.60.0-cp312-cp312-") and ray.endswith("x86_64.whl")
