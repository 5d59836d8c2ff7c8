"""`pip install .` puts nothing at the top level but `clustersim` (the repository root is
that package: pyproject.toml's package-dir), and the installed package imports and runs
from outside the repository, in a fresh virtual environment."""
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source") / "clustersim"  # setuptools writes build/
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", str(source), "-w", str(out)], check=True,
                   capture_output=True, timeout=300)
    (path,) = out.glob("clustersim-*.whl")
    return path


def test_the_wheel_installs_one_top_level_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"clustersim", next(t for t in tops if t.endswith(".dist-info"))}
    folders = {name.split("/")[1] for name in names if name.startswith("clustersim/")}
    root_modules = {"__init__.py", "__main__.py", "user_files.py"}
    assert folders == root_modules | {"schedules", "topologies", "sim", "kernels"}
    assert any(n.startswith("clustersim/topologies/presets/") for n in names)  # data files
    packages = {str(p.parent.relative_to(ROOT)) for folder in folders - root_modules
                for p in (ROOT / folder).rglob("__init__.py")}
    assert {f"clustersim/{p}/__init__.py" for p in packages} <= set(names)  # none left out


def test_a_fresh_venv_imports_and_runs_the_installed_package(wheel, tmp_path):
    env = tmp_path / "venv"
    venv.create(env, system_site_packages=True, with_pip=False)  # deps from this Python
    python = env / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                    "--quiet", "--no-deps", str(wheel)], check=True, capture_output=True,
                   timeout=300)
    code = ("import clustersim, sys; assert clustersim.__file__.startswith(sys.prefix), "
            "clustersim.__file__; print(clustersim.__version__, "
            "clustersim.get_model('gpt3-1.3b').num_layers)")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, check=True)
    assert out.stdout.split() == [clustersim_version(), "24"]
    version = subprocess.run([str(env / "bin" / "clustersim"), "--version"],
                             capture_output=True, text=True, cwd=tmp_path, check=True)
    assert version.stdout.strip() == f"clustersim {clustersim_version()}"


def clustersim_version() -> str:
    import clustersim
    return clustersim.__version__
