"""What a node has: GPUs (NVML, or a declared inventory), CPUs, memory, hostname, the address to advertise.

GPUs come from NVML through nvidia-ml-py, never from parsing nvidia-smi (docs/tensorflow.md: GPUs). The agent's own
CUDA_VISIBLE_DEVICES, by index or UUID, limits what it offers, the way CUDA itself would read it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import psutil

from tfcluster.model import Gpu

log = logging.getLogger("tfcluster.agent")


class InventoryError(ValueError):
    pass


@dataclass(frozen=True)
class HostInfo:
    hostname: str
    cpu_count: int
    memory_bytes: int
    gpu_driver: str = ""    # the NVIDIA driver's version; "": none read (gpu_driver())
    cuda_version: str = ""  # the newest CUDA that driver supports


def host_info(inventory: str | None = "none") -> HostInfo:
    """The host, with its GPU driver read as its GPUs are (gpu_driver(inventory); the default: none)."""
    driver, cuda = gpu_driver(inventory)
    return HostInfo(hostname=socket.gethostname(), cpu_count=psutil.cpu_count(logical=True) or 1,
                    memory_bytes=psutil.virtual_memory().total, gpu_driver=driver, cuda_version=cuda)


def gpu_driver(inventory: str | None = None) -> tuple[str, str]:
    """(driver version, CUDA version) from NVML, or as an inventory declares them; ("", "") when unknown. A
    cluster whose nodes run different drivers is what `tfcluster doctor` warns of: NCCL across them may fail."""
    if inventory is not None:
        if inventory.lower() == "none":
            return "", ""
        _, driver, cuda = _read_inventory(Path(inventory))
        return driver, cuda
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # no library, no driver: discover_gpus has said so
        return "", ""
    try:
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()  # e.g. 13000
        return _text(pynvml.nvmlSystemGetDriverVersion()), f"{cuda // 1000}.{cuda % 1000 // 10}"
    except Exception as e:
        log.info("NVML does not say the driver's version (%s)", _nvml_reason(e))
        return "", ""
    finally:
        pynvml.nvmlShutdown()


def discover_gpus(inventory: str | None = None, environ: dict[str, str] | None = None) -> list[Gpu]:
    """GPUs this agent offers. inventory: a JSON file declaring them, "none" for CPU only, None for NVML."""
    if inventory is not None:
        if inventory.lower() == "none":
            return []
        return load_inventory(Path(inventory))
    environ = os.environ if environ is None else environ
    return filter_visible(nvml_gpus(), environ.get("CUDA_VISIBLE_DEVICES"))


def nvml_gpus() -> list[Gpu]:
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ... : all mean "no usable GPUs"
        log.info("NVML unavailable (%s): registering as CPU only", _nvml_reason(e))
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(Gpu(index=index, uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                            name=_text(pynvml.nvmlDeviceGetName(handle)),
                            memory_mib=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024)))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _nvml_reason(error: Exception) -> str:
    text = str(error) or type(error).__name__
    return text.splitlines()[0]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def filter_visible(gpus: list[Gpu], visible: str | None) -> list[Gpu]:
    """Applies CUDA_VISIBLE_DEVICES as CUDA does: indexes or UUIDs (or unique UUID prefixes), in order,
    stopping at the first entry that names no device."""
    if visible is None:
        return gpus
    chosen: list[Gpu] = []
    for token in (t.strip() for t in visible.split(",")):
        match = None
        if token.lstrip("-").isdigit():
            index = int(token)
            match = next((g for g in gpus if g.index == index), None)
        elif token:
            prefixed = [g for g in gpus if g.uuid.startswith(token) or g.uuid.startswith(f"GPU-{token}")]
            match = prefixed[0] if len(prefixed) == 1 else None
        if match is None:
            break
        if match not in chosen:
            chosen.append(match)
    return chosen


def _read_inventory(path: Path) -> tuple[list, str, str]:
    """The inventory's GPU entries, driver and CUDA version. A JSON list of GPUs, or an object
    {"driver": "...", "cuda": "...", "gpus": [...]} that declares the driver too."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise InventoryError(f"{path}: cannot read GPU inventory: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise InventoryError(f"{path}: not valid JSON: {e}") from None
    if isinstance(data, list):
        return data, "", ""
    if not isinstance(data, dict):
        raise InventoryError(f"{path}: expected a JSON list of GPUs or an object with gpus, got "
                             f"{type(data).__name__}")
    unknown = set(data) - {"driver", "cuda", "gpus"}
    if unknown:
        raise InventoryError(f"{path}: unknown key {sorted(unknown)[0]!r} (expected driver, cuda, gpus)")
    for key, limit in (("driver", 64), ("cuda", 16)):
        if not isinstance(data.get(key, ""), str) or len(data.get(key, "")) > limit:
            raise InventoryError(f"{path}: {key}: expected a string of at most {limit} characters")
    if not isinstance(data.get("gpus", []), list):
        raise InventoryError(f"{path}: gpus: expected a JSON list of GPUs, got {type(data['gpus']).__name__}")
    return data.get("gpus", []), data.get("driver", ""), data.get("cuda", "")


def load_inventory(path: Path) -> list[Gpu]:
    """A JSON list of {index, uuid, name, memory_mib} (or an object with it as `gpus`): GPUs declared instead of
    discovered."""
    data, _, _ = _read_inventory(path)
    gpus = []
    for i, item in enumerate(data):
        where = f"{path}: [{i}]"
        if not isinstance(item, dict):
            raise InventoryError(f"{where}: expected an object with index, uuid, name, memory_mib")
        unknown = set(item) - {"index", "uuid", "name", "memory_mib"}
        if unknown:
            raise InventoryError(f"{where}: unknown key {sorted(unknown)[0]!r} (expected index, uuid, name, memory_mib)")
        index = item.get("index", i)
        memory = item.get("memory_mib", 0)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise InventoryError(f"{where}.index: expected an integer >= 0, got {index!r}")
        if isinstance(memory, bool) or not isinstance(memory, int) or memory < 0:
            raise InventoryError(f"{where}.memory_mib: expected an integer >= 0, got {memory!r}")
        for key in ("uuid", "name"):
            if not isinstance(item.get(key, ""), str):
                raise InventoryError(f"{where}.{key}: expected a string, got {item[key]!r}")
        gpus.append(Gpu(index=index, uuid=item.get("uuid", ""), name=item.get("name", ""), memory_mib=memory))
    if len({g.index for g in gpus}) != len(gpus):
        raise InventoryError(f"{path}: GPU indexes must be unique")
    return gpus


def advertise_address(coordinator: str) -> str:
    """The IP of the interface that reaches the coordinator (a UDP connect sends nothing)."""
    host, _, port = coordinator.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        infos = socket.getaddrinfo(host, int(port or 7070), family, socket.SOCK_DGRAM)
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(infos[0][4])
            return s.getsockname()[0]
    except OSError as e:
        raise OSError(f"cannot find the address that reaches the coordinator {coordinator}: {e}; "
                      f"pass --advertise-address") from None
