"""What an agent finds of its GPUs without NVML: a declared inventory (a list of GPUs, or an object that names the
driver too), refused with the key that is wrong, and CUDA_VISIBLE_DEVICES applied as CUDA reads it."""

from __future__ import annotations

import json

import pytest

from tfcluster.daemon.agent.session.discovery import (InventoryError, discover_gpus, filter_visible, gpu_driver,
                                                      host_info)


def inventory(tmp_path, data) -> str:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(data))
    return str(path)


GPUS = [{"index": 0, "uuid": "GPU-aaa", "name": "Test GPU", "memory_mib": 16384},
        {"index": 1, "uuid": "GPU-bbb", "name": "Test GPU", "memory_mib": 16384}]


def test_a_list_declares_gpus_and_no_driver(tmp_path):
    path = inventory(tmp_path, GPUS)
    assert [g.uuid for g in discover_gpus(path)] == ["GPU-aaa", "GPU-bbb"]
    assert gpu_driver(path) == ("", "")


def test_an_object_declares_the_driver_and_cuda_beside_the_gpus(tmp_path):
    path = inventory(tmp_path, {"driver": "580.159.04", "cuda": "13.0", "gpus": GPUS})
    assert [g.index for g in discover_gpus(path)] == [0, 1]
    assert gpu_driver(path) == ("580.159.04", "13.0")
    host = host_info(path)
    assert (host.gpu_driver, host.cuda_version) == ("580.159.04", "13.0") and host.cpu_count >= 1
    assert gpu_driver("none") == ("", "") and host_info().gpu_driver == ""


@pytest.mark.parametrize("data, said", [
    ({"driver": "580", "gpu": []}, "unknown key 'gpu' (expected driver, cuda, gpus)"),
    ({"driver": 580, "gpus": []}, "driver: expected a string of at most 64 characters"),
    ({"gpus": {"index": 0}}, "gpus: expected a JSON list of GPUs, got dict"),
    ("580", "expected a JSON list of GPUs or an object with gpus, got str"),
])
def test_a_wrong_inventory_is_refused_naming_the_key(tmp_path, data, said):
    with pytest.raises(InventoryError, match=said.replace("(", r"\(").replace(")", r"\)")):
        path = inventory(tmp_path, data)
        discover_gpus(path)
        gpu_driver(path)


def test_cuda_visible_devices_limits_and_orders_what_is_offered(tmp_path):
    gpus = discover_gpus(inventory(tmp_path, GPUS))
    assert [g.index for g in filter_visible(gpus, "1,0")] == [1, 0]
    assert [g.index for g in filter_visible(gpus, "GPU-bbb")] == [1]
    assert filter_visible(gpus, "7,0") == [], "CUDA stops at the first entry that names no device"
