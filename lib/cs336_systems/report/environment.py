"""What the report was measured on: hardware, software versions, commit, date, profile."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path

import torch

PROFILES = ("cpu", "gpu")


def resolve_profile(profile: str | None = None) -> str:
    """`None`/"auto" picks `gpu` when CUDA is available, else `cpu`; `gpu` without CUDA is an error."""
    profile = profile or os.environ.get("CS336_PROFILE") or "auto"
    if profile == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)} or 'auto'")
    if profile == "gpu" and not torch.cuda.is_available():
        raise ValueError("profile 'gpu' needs a CUDA device, and torch.cuda.is_available() is False")
    return profile


def repo_root(start: Path | None = None) -> Path:
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "pyproject.toml").exists() and (d / "lib" / "cs336_systems").exists():
            return d
    return Path(__file__).resolve().parents[3]


def git_commit(root: Path | None = None) -> str:
    """`git describe` of the checkout, or $CS336_COMMIT where the tree was copied without .git."""
    if os.environ.get("CS336_COMMIT"):
        return os.environ["CS336_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"],
            cwd=root or repo_root(),
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _package_version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return "not installed"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment_info(profile: str | None = None) -> dict[str, str]:
    info: dict[str, str] = {}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        n = torch.cuda.device_count()
        info["GPU"] = f"{n} × {props.name} ({props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs)"
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            info["driver"] = smi.stdout.strip().splitlines()[0] if smi.stdout.strip() else "unknown"
        except (OSError, subprocess.SubprocessError):
            info["driver"] = "unknown"
        info["CUDA (torch build)"] = str(torch.version.cuda)
    else:
        info["GPU"] = "none (CPU only)"
    info["CPU"] = f"{_cpu_name()}, {os.cpu_count()} logical cores"
    info["python"] = platform.python_version()
    info["torch"] = torch.__version__
    info["triton"] = _package_version("triton")
    info["platform"] = platform.platform()
    info["profile"] = resolve_profile(profile) if profile != "n/a" else "n/a"
    info["commit"] = git_commit()
    info["date"] = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return info


def device_label() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"CPU ({os.cpu_count()} cores)"
