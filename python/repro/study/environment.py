"""What a study's results depend on besides its settings (torch, cuDNN, CUDA, the GPU and its
driver), and writing results so that an interrupted study never leaves half a file."""

from __future__ import annotations

import json
import os
import platform
import subprocess

import torch


def describe_environment(device: torch.device) -> dict:
    """The versions and the device a study ran on."""
    env = {"torch": torch.__version__, "python": platform.python_version(), "device": str(device),
           "cpu": platform.processor() or platform.machine(), "cpu_threads": torch.get_num_threads()}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
        env["driver"] = _driver()
    try:
        import torchvision

        env["torchvision"] = torchvision.__version__
    except ImportError:
        pass
    env["CUBLAS_WORKSPACE_CONFIG"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    return env


def _driver():
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
        return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def write_json(path: str, value) -> None:
    """Writes `value` to `path` as JSON through a temporary file and a rename."""
    temporary = f"{path}.partial"
    with open(temporary, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(temporary, path)
